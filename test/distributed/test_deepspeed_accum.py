"""Gradient accumulation through the executor: ZeRO-2 with accum_grad 2 takes the same steps and reaches the same
weights as torch_ddp (the executor owns the boundary; DeepSpeed must neither rescale the loss nor step early)."""

import json
import os

import pytest

from .launch import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_engine.py")


def train(out_dir, *args):
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(WORKER, str(out_dir), "7", "6", "--accum_grad", "2", *args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(2)]


def test_zero2_accumulation_matches_torch_ddp(tmp_path):
    ddp = train(tmp_path / "ddp")
    ds = train(tmp_path / "zero2", "--engine", "deepspeed", "--stage", "2")
    for rank in range(2):
        assert ddp[rank]["steps"] == ds[rank]["steps"] == 3  # 6 micro-batches in lock-step / accum_grad 2
        assert ds[rank]["losses"] == pytest.approx(ddp[rank]["losses"], abs=1e-5)
    assert ds[0]["dropped"] == 1
    for key, values in ddp[0]["params"].items():
        assert ds[0]["params"][key] == pytest.approx(values, abs=1e-6)
        assert ds[1]["params"][key] == ds[0]["params"][key]
