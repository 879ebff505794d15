"""Uneven data across 2 real gloo ranks: the flag join keeps every rank in lock-step and never hangs."""

import json
import os

import pytest

from .launch import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_train.py")


def reports(out_dir, n=2):
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(n)]


def test_uneven_batches_stop_together_with_identical_replicas(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), "5", "3", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = reports(tmp_path)
    assert r0["steps"] == r1["steps"] == 3
    assert (r0["dropped"], r1["dropped"]) == (2, 0)
    assert r0["global_dropped"] == 2
    assert r0["global_utts"] == r1["global_utts"] == 2 * 3 * 4
    # Same parameters, same Adam moments, same LR on both ranks (DDP's model.join() would leave rank 1's
    # optimizer two steps behind).
    assert r0["params"] == r1["params"]
    assert r0["exp_avg"] == r1["exp_avg"]
    assert r0["lr"] == r1["lr"]


def test_accum_grad_steps_once_per_accumulation(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), "4", "5", "--accum_grad", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = reports(tmp_path)
    assert r0["join_steps"] == r1["join_steps"] == 4  # batches both ranks trained on
    assert r0["steps"] == r1["steps"] == 2            # optimizer steps = 4 // accum_grad
    assert r1["dropped"] == 1
    assert r0["params"] == r1["params"]


@pytest.mark.parametrize("sleep_s", [2.0])
def test_a_slow_rank_never_shortens_the_epoch(tmp_path, sleep_s):
    # Rank 1 stalls before every batch; no clock is involved in the join, so every batch is trained.
    proc = run_ranks(WORKER, str(tmp_path), "3", "3", "--sleep_rank1_s", str(sleep_s), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = reports(tmp_path)
    assert r0["steps"] == r1["steps"] == 3
    assert r0["dropped"] == r1["dropped"] == 0
    assert r0["params"] == r1["params"]
