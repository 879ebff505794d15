"""Gradient accumulation through the executor: ZeRO-2 with accum_grad 2 takes the same steps and reaches the same
weights as torch_ddp (the executor owns the boundary; DeepSpeed must neither rescale the loss nor step early).

The engines sum the same gradients in another order, so their float32 results may differ in the last bits: the
comparison allows exactly the rounding bound of ``worker_engine.RoundingBound`` (a model linear in its parameters,
SGD: a wrong scale or grouping moves the weights by far more than that bound)."""

import os

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks
from .workers.tiny_ctc import assert_within_rounding

WORKER = str(WORKERS / "worker_engine.py")
LINEAR_SGD = ("--model", "linear", "--optim", "sgd", "--grad_clip", "0")  # clipping would hide a wrong scale


def train(out_dir, *args):
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(WORKER, str(out_dir), "7", "6", "--accum_grad", "2", *LINEAR_SGD, *args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return read_rank_reports(out_dir, 2)


def test_zero2_accumulation_matches_torch_ddp(tmp_path):
    ddp = train(tmp_path / "ddp", "--record_bound")
    ds = train(tmp_path / "zero2", "--engine", "deepspeed", "--stage", "2")
    for rank in range(2):
        assert ddp[rank]["steps"] == ds[rank]["steps"] == 3  # 6 micro-batches in lock-step / accum_grad 2
        assert ds[rank]["lr"] == ddp[rank]["lr"]
        # Before the first step both engines hold the same weights: the same forward, bit for bit.
        assert ds[rank]["losses"][:2] == ddp[rank]["losses"][:2]
    assert ds[0]["dropped"] == 1
    assert_within_rounding(ds[0], ddp[0])
    assert ds[1]["params"] == ds[0]["params"]
