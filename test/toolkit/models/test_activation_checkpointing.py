"""Activation checkpointing of the encoder and decoder layers on real speech (tiny_fsdd), dropout on everywhere: the
same seed gives the same loss, gradients, BatchNorm statistics and RNG state bit for bit, with the layers really
recomputed; evaluation, no-grad passes and TorchScript run the layers once, as without it."""

import copy

import pytest
import torch

from toolkit.models.checks import check_model
from toolkit.models.registry import init_model
from toolkit.train_config import Config
from toolkit.utils.common import IGNORE_ID

from .conftest import assert_equal_up_to_rounding

KEYS = ["george-0-01", "jackson-1-00", "lucas-2-01", "nicolas-3-00"]
DROPOUT = dict(dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1)


def _model(encoder: str, cnn_module_norm: str = "batch_norm", vocab_size: int = 20):
    encoder_conf = dict(output_size=64, attention_heads=2, linear_units=128, num_blocks=2, **DROPOUT)
    if encoder == "conformer":
        encoder_conf.update(cnn_module_kernel=7, cnn_module_norm=cnn_module_norm)
    config = Config(cmvn=None, encoder=encoder, encoder_conf=encoder_conf, decoder="transformer",
                    decoder_conf=dict(attention_heads=2, linear_units=128, num_blocks=2, dropout_rate=0.1,
                                      positional_dropout_rate=0.1, self_attention_dropout_rate=0.1,
                                      src_attention_dropout_rate=0.1),
                    model_conf=dict(ctc_weight=0.3, lsm_weight=0.1))
    torch.manual_seed(0)
    return init_model(config, 80, vocab_size)


def _batch(corpus):
    texts = [corpus.text[key] for key in KEYS]
    units = sorted(set("".join(texts)))
    feats, lengths = corpus.batch(KEYS)
    feats = (feats - feats.mean(dim=(0, 1))) / feats.std(dim=(0, 1))
    target = torch.nn.utils.rnn.pad_sequence([torch.tensor([2 + units.index(c) for c in t]) for t in texts],
                                             batch_first=True, padding_value=IGNORE_ID)
    return feats, lengths, target, torch.tensor([len(t) for t in texts])


def _layers(model):
    return [*model.encoder.encoders, *model.decoder.decoders]


def _count_layer_forwards(model) -> tuple[list[int], list]:
    """Per encoder/decoder layer, how many times its forward ran (updated in place); the hooks' handles."""
    counts = [0] * len(_layers(model))
    handles = [layer.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
               for i, layer in enumerate(_layers(model))]
    return counts, handles


def _train_step(model, batch, checkpointing: bool, dtype: torch.dtype = torch.float32, seed: int = 1):
    model.set_activation_checkpointing(checkpointing)
    model.train()
    counts, _ = _count_layer_forwards(model)
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        loss = model(*batch)["loss"]
    loss.backward()
    return {"loss": loss.detach(), "grads": {n: p.grad for n, p in model.named_parameters()},
            "state": model.state_dict(), "rng": torch.get_rng_state(), "forwards": counts}


@pytest.mark.parametrize("encoder, norm, dtype", [("conformer", "batch_norm", torch.float32),
                                                  ("conformer", "layer_norm", torch.bfloat16),
                                                  ("transformer", None, torch.float32)])
def test_same_seed_same_loss_gradients_and_state_bit_for_bit(tiny_fsdd, encoder, norm, dtype):
    model, batch = _model(encoder, norm), _batch(tiny_fsdd)
    plain = _train_step(copy.deepcopy(model), batch, False, dtype)
    checkpointed = _train_step(copy.deepcopy(model), batch, True, dtype)
    assert plain["forwards"] == [1] * len(plain["forwards"])
    assert checkpointed["forwards"] == [2] * len(plain["forwards"])  # each layer recomputed in the backward
    assert torch.isfinite(plain["loss"]) and torch.equal(plain["loss"], checkpointed["loss"])
    assert plain["grads"].keys() == checkpointed["grads"].keys()
    for name, grad in plain["grads"].items():
        assert grad is not None and torch.equal(grad, checkpointed["grads"][name]), name
    # BatchNorm's running statistics moved once, not once more in the recomputation.
    for name, value in plain["state"].items():
        assert torch.equal(value, checkpointed["state"][name]), name
        if name.endswith("num_batches_tracked"):
            assert int(checkpointed["state"][name]) == 1
    assert torch.equal(plain["rng"], checkpointed["rng"])  # the recomputation drew from a forked RNG
    # Dropout is really on: another seed gives another loss, so the equality above is the masks replayed.
    assert not torch.equal(_train_step(copy.deepcopy(model), batch, True, dtype, seed=2)["loss"], plain["loss"])


def test_evaluation_no_grad_and_torchscript_run_each_layer_once(tiny_fsdd):
    model, batch = _model("conformer").double(), _batch(tiny_fsdd)
    feats, lengths = batch[0].double(), batch[1]
    model.set_activation_checkpointing(True)
    counts, hooks = _count_layer_forwards(model)
    with torch.no_grad():
        model.train()(feats, lengths, *batch[2:])
    assert counts == [1] * len(counts)
    model.eval()(feats, lengths, *batch[2:])["loss"].backward()  # evaluation mode, gradients on
    assert counts == [2] * len(counts)
    for hook in hooks:  # TorchScript would compile them
        hook.remove()
    logged = []
    check_model(model, log=lambda fmt, *args: logged.append(fmt % args))  # scripts encoder and decoder
    assert "activation_checkpointing=True" in logged[0]
    scripted = torch.jit.script(model.encoder)
    assert "checkpoint" not in scripted.code
    with torch.no_grad():
        assert_equal_up_to_rounding(scripted(feats, lengths)[0], model.encoder(feats, lengths)[0])
