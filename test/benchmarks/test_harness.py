"""benchmarks/harness.py: the step clock's split adds up, the run summary's arithmetic, counted FLOPs; a benchmark's
subprocess runs the checkout it is given."""

import os
import subprocess
import sys

import pytest
import torch
from harness import PARTS, StepClock, count_train_flops, source_env, summarize_steps
from torch.utils.flop_counter import FlopCounterMode

from toolkit.models.registry import init_model
from toolkit.train_config import Config

from test.helpers import REPO_ROOT



def _step(wall, frames, **parts):
    record = {p: parts.get(p, 0.0) for p in PARTS}
    record.update(allreduce_busy=0.0, gc=0.0, wall=wall, frames=frames, padded_frames=2 * frames, utts=1)
    record["other"] = wall - sum(record[p] for p in PARTS)
    return record


def test_the_parts_and_other_add_up_to_the_wall_time():
    clock = StepClock()
    clock.restart()
    with clock.part("forward"):
        sum(range(10000))
    clock.add("data", 0.0)
    clock.add_batch(frames=120, padded_frames=150, utts=2)
    record = clock.end_step()
    assert (record["frames"], record["padded_frames"], record["utts"]) == (120, 150, 2) and record["forward"] > 0
    assert sum(record[p] for p in PARTS) + record["other"] == pytest.approx(record["wall"], abs=1e-12)
    assert clock.end_step()["frames"] == 0  # the next step starts empty


def test_summary_counts_all_ranks_frames_over_the_slowest_ranks_time():
    rank0 = [_step(5.0, 100), _step(1.0, 300, forward=0.4), _step(2.0, 500, forward=0.6)]
    rank1 = [_step(5.0, 100), _step(1.5, 200, forward=0.5), _step(1.0, 100, forward=0.3)]
    summary = summarize_steps([rank0, rank1], 0.01, warmup=1)
    assert summary["frames_per_s"] == pytest.approx((300 + 500 + 200 + 100) / 3.0)
    assert summary["audio_s_per_s"] == pytest.approx(11.0 / 3.0)
    assert summary["epoch_frames_per_s"] == pytest.approx(1300 / 8.0)
    assert summary["split_s"]["forward"] == pytest.approx(0.45)
    assert summary["frames_per_step"] == pytest.approx(275)
    assert summary["padding_fraction"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        summarize_steps([rank0], 0.01, warmup=3)


class _Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        return {"loss": self.proj(x).sum()}


def test_counted_flops_of_a_linear_layer():
    # (3, 8) x (8, 4): 2*3*8*4 = 192 forward; backward: the input's gradient (the input needs one) and the weight's.
    flops = count_train_flops(_Affine(), (torch.randn(3, 8, requires_grad=True),))
    assert flops["total"] == 3 * 192
    assert flops["by_module"] == {"proj": 3 * 192}


def test_counted_flops_leave_out_the_recomputation_of_activation_checkpointing():
    config = Config(cmvn=None, encoder="transformer", decoder="transformer",
                    encoder_conf=dict(output_size=32, attention_heads=2, linear_units=64, num_blocks=2),
                    decoder_conf=dict(attention_heads=2, linear_units=64, num_blocks=1))
    model = init_model(config, 80, 10)
    inputs = (torch.randn(2, 100, 80), torch.tensor([100, 80]), torch.tensor([[2, 3], [4, 5]]), torch.tensor([2, 1]))
    plain = count_train_flops(model, inputs)["total"]
    model.set_activation_checkpointing(True)
    with FlopCounterMode(display=False) as executed:
        model(*inputs)["loss"].backward()
    assert executed.get_total_flops() > plain  # the layers' forwards ran twice
    assert count_train_flops(model, inputs)["total"] == plain


def test_a_benchmark_subprocess_imports_the_given_checkout_even_beside_a_recipe_link(tmp_path):
    # bench_decode runs recognize from a recipe dir, whose `toolkit` link to this checkout sat first on sys.path
    # (Python puts the working directory there for -m and -c) and won over PYTHONPATH.
    other = tmp_path / "other_checkout" / "toolkit"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    os.symlink(os.path.join(REPO_ROOT, "toolkit"), recipe / "toolkit")
    out = subprocess.run([sys.executable, "-c", "import toolkit; print(toolkit.__file__)"], cwd=recipe,
                         env=source_env(str(tmp_path / "other_checkout")), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(other / "__init__.py")
