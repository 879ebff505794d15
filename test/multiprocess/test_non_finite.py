"""Non-finite values on 2 real gloo ranks, torch_ddp against DeepSpeed ZeRO 0 and 2 and torch_fsdp (CPU), accum_grad
2: a NaN loss on one rank costs only that micro-batch (the step goes on with the other ranks' and micro-batches'
gradients), and an infinite gradient skips the update and the LR step on every rank of every engine alike."""

import math
import os

import pytest
import torch

from toolkit.utils.scheduler import init_optimizer_and_scheduler

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_non_finite.py")
# Rank 1's batch 2 (first micro-batch of step 2) has a NaN loss; rank 0's batch 5 (second micro-batch of step 3)
# overflows in the backward pass. 8 batches of 4 utterances per rank, accum_grad 2: 4 steps.
POISON = ("--accum_grad", "2", "--nan", "1:2", "--overflow", "0:5")


def train(out_dir, *args):
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(WORKER, str(out_dir), *POISON, *args, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return read_rank_reports(out_dir, 2), proc.stderr


def lr_after(steps: int) -> float:
    optimizer, scheduler = init_optimizer_and_scheduler([torch.nn.Parameter(torch.zeros(1))], "adam", {"lr": 0.01},
                                                        "warmuplr", {"warmup_steps": 2})
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return optimizer.param_groups[0]["lr"]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ddp"))


def assert_skips_only_the_bad_micro_batch(reports, stderr):
    for rank, report in enumerate(reports):
        assert report["steps"] == 4 and report["skipped_steps"] == 1
        # 3 updates applied: the NaN step was not lost, the overflow step was, and the LR schedule counts updates.
        assert report["adam_steps"] == [3] and report["scheduler_steps"] == 3
        assert report["lr"] == pytest.approx(lr_after(3), rel=1e-12)
        assert all(math.isfinite(x) for values in report["params"].values() for x in values)
    assert reports[0]["params"] == reports[1]["params"]
    assert reports[0]["skipped"] == {} and reports[1]["skipped"] == {"non_finite_loss": 4}
    assert (reports[0]["num_utts"], reports[1]["num_utts"]) == (32, 28)  # 32 offered each, 4 counted as skipped
    assert math.isnan(reports[1]["losses"][2]) and math.isfinite(reports[1]["loss_sum"])
    assert "4 counted as non_finite_loss" in stderr and "update skipped (the LR schedule does not advance)" in stderr


def test_torch_ddp_skips_only_the_bad_micro_batch_and_the_overflowed_step(ddp):
    assert_skips_only_the_bad_micro_batch(*ddp)


@pytest.mark.parametrize("engine", [("deepspeed", "--stage", "0"), ("deepspeed", "--stage", "2"), ("torch_fsdp",)],
                         ids=["zero0", "zero2", "fsdp"])
def test_other_engines_agree_with_torch_ddp(ddp, tmp_path, engine):
    reports, stderr = train(tmp_path, "--engine", *engine)
    assert_skips_only_the_bad_micro_batch(reports, stderr)
    for rank in range(2):
        expected = ddp[0][rank]
        assert reports[rank]["lr"] == expected["lr"]
        assert reports[rank]["losses"] == pytest.approx(expected["losses"], abs=1e-4, nan_ok=True)
        for key, values in expected["params"].items():
            assert reports[rank]["params"][key] == pytest.approx(values, abs=1e-6)
