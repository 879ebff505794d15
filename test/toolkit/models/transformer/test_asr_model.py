import pytest
import torch

from toolkit.config import Config
from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import DECODING_METHODS, ASRModel, add_sos_eos
from toolkit.utils.common import IGNORE_ID

# Four different speakers and words; the shortest (0.33 s) still has 7 encoder frames for the
# 5 tokens of THREE.
KEYS = ["george-0-01", "jackson-1-00", "lucas-2-01", "nicolas-3-00"]


def _model(vocab_size: int, ctc_weight: float, encoder: str = "conformer") -> ASRModel:
    encoder_conf = dict(output_size=64, attention_heads=2, linear_units=128, num_blocks=2,
                        dropout_rate=0.0, positional_dropout_rate=0.0)
    if encoder == "conformer":
        encoder_conf["cnn_module_kernel"] = 7
    config = Config(cmvn=None, encoder=encoder, encoder_conf=encoder_conf, decoder="transformer",
                    decoder_conf=dict(attention_heads=2, linear_units=128, num_blocks=1,
                                      dropout_rate=0.0, positional_dropout_rate=0.0),
                    model_conf=dict(ctc_weight=ctc_weight, lsm_weight=0.1))
    return init_model(config, 80, vocab_size)


def _batch(tiny_fsdd):
    """Normalised fbank, character targets and the vocabulary for KEYS."""
    texts = [tiny_fsdd.text[key] for key in KEYS]
    vocab = ["<blank>", "<unk>"] + sorted(set("".join(texts))) + ["<sos/eos>"]
    feats, lengths = tiny_fsdd.batch(KEYS)
    # Stand-in for global CMVN; padding stays zero-padded in spirit (it is never read).
    feats = (feats - feats.mean(dim=(0, 1))) / feats.std(dim=(0, 1))
    targets = [torch.tensor([vocab.index(c) for c in text]) for text in texts]
    target_lengths = torch.tensor([len(t) for t in targets])
    target = torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=IGNORE_ID)
    return feats, lengths, target, target_lengths, vocab, texts


def test_add_sos_eos():
    ys = torch.tensor([[3, 4, 5], [6, IGNORE_ID, IGNORE_ID]])
    ys_in, ys_out = add_sos_eos(ys, torch.tensor([3, 1]), sos=9, eos=9)
    assert ys_in.tolist() == [[9, 3, 4, 5], [9, 6, 9, 9]]
    assert ys_out.tolist() == [[3, 4, 5, 9], [6, 9, IGNORE_ID, IGNORE_ID]]


@pytest.mark.parametrize("encoder", ["conformer", "transformer"])
def test_hybrid_loss_is_weighted_sum(tiny_fsdd, encoder):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3, encoder)
    out = model(feats, lengths, target, target_lengths)
    assert out["loss"].dim() == 0 and out["loss"].requires_grad
    assert torch.allclose(out["loss"], 0.3 * out["loss_ctc"] + 0.7 * out["loss_att"])
    assert 0.0 <= out["th_accuracy"].item() <= 1.0
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_extreme_ctc_weights_drop_one_branch(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, _ = _batch(tiny_fsdd)
    ctc_only = _model(len(vocab), 1.0)(feats, lengths, target, target_lengths)
    assert ctc_only["loss_att"] is None and ctc_only["th_accuracy"] is None
    assert torch.equal(ctc_only["loss"], ctc_only["loss_ctc"])
    att_only = _model(len(vocab), 0.0)(feats, lengths, target, target_lengths)
    assert att_only["loss_ctc"] is None
    assert torch.equal(att_only["loss"], att_only["loss_att"])


def test_unknown_decoding_method_lists_valid_ones(tiny_fsdd):
    feats, lengths, _, _, vocab, _ = _batch(tiny_fsdd)
    model = _model(len(vocab), 0.3).eval()
    with pytest.raises(ValueError, match="attention_rescoring"):
        model.decode(["beam"], feats, lengths)


def test_overfit_four_utterances_all_decoding_methods(tiny_fsdd):
    feats, lengths, target, target_lengths, vocab, texts = _batch(tiny_fsdd)
    torch.manual_seed(0)
    model = _model(len(vocab), 0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Tensors this small gain nothing from intra-op threads, and on a loaded 2-core machine
    # OpenMP threads spinning against other processes make the loop up to 10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(120):
            out = model(feats, lengths, target, target_lengths)
            optimizer.zero_grad()
            out["loss"].backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    assert out["th_accuracy"].item() == 1.0
    model.eval()
    results = model.decode(list(DECODING_METHODS), feats, lengths, beam_size=4)
    assert set(results) == set(DECODING_METHODS)
    for method, hyps in results.items():
        assert ["".join(vocab[t] for t in hyp) for hyp in hyps] == texts, method
    # Decoding a single utterance gives the same answer as in the batch.
    alone = model.decode(["attention", "attention_rescoring"], feats[3:, :lengths[3]],
                         lengths[3:], beam_size=4)
    assert alone == {"attention": [results["attention"][3]],
                     "attention_rescoring": [results["attention_rescoring"][3]]}
