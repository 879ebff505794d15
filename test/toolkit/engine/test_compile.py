"""``train_conf.compile`` (:mod:`toolkit.engine.compile`): the tiny recipe model with its encoder and decoder layers
compiled in place trains like the eager model, one dynamic graph serves every T, and its checkpoint is an eager
model's. (Bit-identical mid-epoch resume with compile on:
test/multiprocess/test_exact_resume.py::test_ddp_mid_epoch_resume_with_compiled_layers_is_bit_identical.)"""

import copy
import os

import pytest
import torch

from toolkit.engine.compile import compile_blocks
from toolkit.models.registry import init_model
from toolkit.train_config import read_config

from test.helpers import REPO_ROOT

# The slow tier: the fixture trains the model twice, and inductor compiles in worker processes (minutes on a
# busy 2-core machine).
pytestmark = pytest.mark.multiprocess
CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf",
                    "train_tiny.yaml")
VOCAB = 20
STEPS_T = (61, 77, 53, 95, 70)  # one batch per step, each of another length: T' = 14, 18, 12, 22, 16
# NOTE: inductor computes the fused layer norms, softmax and reductions in another order than the eager kernels:
# float32 rounding (about 1e-7 relative per op), which 5 SGD steps carry into the weights. The difference depends
# on the CPU's vector kernels, on both sides: measured (torch 2.13, AMD EPYC AVX2, 2026-12-07) losses agree to
# 3.7e-6 (relative, step 4) and weights to 8.6e-7 with AVX2 kernels on both sides, to 6.9e-7 and 1.5e-6 with eager's
# scalar kernels (ATEN_CPU_CAPABILITY=default) against inductor's AVX2 code (cpp.simdlen 256; with that variable
# alone inductor emits vector code it cannot compile); an earlier machine measured 9e-7 and 8e-7. The bounds leave
# 6x or more above the largest, and still fail any real difference (a dropout mask drawn differently changes the
# loss by percents). NOTE: SGD, not Adam: Adam divides by the gradient's own size, so on
# parameters whose gradient is zero in exact arithmetic (the key projection's bias: softmax ignores a score added
# to every key) it turns rounding noise into full-size steps (2e-4 apart after 5 steps).
LOSS_RTOL = 3e-5
PARAM_ATOL = 1e-5


def _batch(step: int, time: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    feats = torch.randn(4, time, 80, generator=g)
    feats_lengths = torch.tensor([time, time - 5, time - 9, time - 20])
    target = torch.randint(2, VOCAB - 1, (4, 6), generator=g)
    target_lengths = torch.tensor([6, 5, 4, 3])
    target = target.masked_fill(torch.arange(6) >= target_lengths.unsqueeze(1), -1)
    return feats, feats_lengths, target, target_lengths


def _train(model: torch.nn.Module) -> tuple[list[float], torch.Tensor, list[int]]:
    """5 SGD steps, the dropout masks drawn from torch's generator seeded per step; returns the losses, the
    generator's state afterwards and the number of graphs dynamo had compiled after each step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, graphs = [], []
    model.train()
    for step, time in enumerate(STEPS_T):
        torch.manual_seed(100 + step)
        loss = model(*_batch(step, time))["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return losses, torch.get_rng_state(), graphs


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    eager = init_model(read_config(CONF, ["cmvn null"]), input_dim=80, vocab_size=VOCAB)
    compiled = copy.deepcopy(eager)
    names = compile_blocks(compiled)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager_losses, eager_rng, _ = _train(eager)
    compiled_losses, compiled_rng, graphs = _train(compiled)
    return {"eager": eager, "compiled": compiled, "names": names, "graphs": graphs,
            "losses": (eager_losses, compiled_losses), "rng": (eager_rng, compiled_rng)}


def test_compiled_layers_train_like_eager_with_the_same_dropout_draws(trained):
    assert trained["names"] == ["encoder.encoders.0", "encoder.encoders.1", "decoder.decoders.0"]
    eager_losses, compiled_losses = trained["losses"]
    for step, (e, c) in enumerate(zip(eager_losses, compiled_losses)):
        assert abs(c - e) <= LOSS_RTOL * abs(e), (step, e, c)
    eager, compiled = trained["eager"].state_dict(), trained["compiled"].state_dict()
    for key, value in eager.items():
        if value.is_floating_point():
            assert torch.allclose(compiled[key], value, rtol=0, atol=PARAM_ATOL), key
        else:
            assert torch.equal(compiled[key], value), key
    # the compiled dropout drew its masks from torch's generator, exactly as many numbers as eager (inductor's own
    # RNG would have left the generator elsewhere)
    assert torch.equal(*trained["rng"])


def test_one_dynamic_graph_serves_every_length(trained):
    # 5 batches of 5 lengths: what the first batch compiled (the encoder layer's graphs around its eagerly run
    # depthwise convolution, the decoder layer's) serves the next four; nothing compiles again for a new T.
    graphs = trained["graphs"]
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(STEPS_T), graphs


def test_a_compiled_models_checkpoint_is_an_eager_models(trained):
    state = trained["compiled"].state_dict()
    assert not any("_orig_mod" in key for key in state)
    assert list(state) == list(trained["eager"].state_dict())
    torch.manual_seed(1)
    fresh = init_model(read_config(CONF, ["cmvn null"]), input_dim=80, vocab_size=VOCAB)
    fresh.load_state_dict(state, strict=True)
    assert all(torch.equal(value, state[key]) for key, value in fresh.state_dict().items())
    fresh.eval()
    feats, feats_lengths = _batch(9, 66)[:2]
    with torch.no_grad():  # the eager model with those weights still scripts for export
        scripted = torch.jit.script(fresh.encoder)
        assert torch.equal(scripted(feats, feats_lengths)[0], fresh.encoder(feats, feats_lengths)[0])


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="no nn.ModuleList"):
        compile_blocks(torch.nn.Linear(3, 3))
