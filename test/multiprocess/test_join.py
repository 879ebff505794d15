"""Uneven data across 2 real gloo ranks (torch_ddp): both join modes keep every rank in lock-step and never hang;
dropped utterances are accounted for; a slow rank shortens the epoch in monitored_barrier mode only.

DeepSpeed runs of the same scenarios are in ``test_join_deepspeed.py``.
"""

import datetime

import pytest
import torch.distributed as dist
from toolkit.distributed.join import init_join
from toolkit.distributed.context import DistContext
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.config_parsing import ConfigError

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_train.py")


def test_accum_grad_steps_once_per_accumulation(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), "4", "5", "--accum_grad", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["join_steps"] == r1["join_steps"] == 4  # batches both ranks trained on
    assert r0["steps"] == r1["steps"] == 2            # optimizer steps = 4 // accum_grad
    assert r1["dropped"] == 1
    assert r0["params"] == r1["params"]


@pytest.mark.parametrize("sleep_s", [2.0])
def test_a_slow_rank_never_shortens_the_epoch(tmp_path, sleep_s):
    # Rank 1 stalls before every batch; no clock is involved in the join, so every batch is trained.
    proc = run_ranks(WORKER, str(tmp_path), "3", "3", "--sleep_rank1_s", str(sleep_s), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["steps"] == r1["steps"] == 3
    assert r0["dropped"] == r1["dropped"] == 0
    assert r0["params"] == r1["params"]


@pytest.mark.parametrize("join_mode", ["flag", "monitored_barrier"])
def test_uneven_batches_both_modes_two_epochs_account_for_every_utterance(tmp_path, join_mode):
    # 5 vs 3 batches of 4 utterances, each batch also carrying 1 utterance the pipeline skipped; 2 epochs, so
    # monitored_barrier must work again after its first timeout (a reused group would train 1 batch in epoch 1).
    proc = run_ranks(WORKER, str(tmp_path), "5", "3", "--join_mode", join_mode, "--join_timeout_s", "3",
                     "--epochs", "2", "--skipped_per_batch", "1", timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["steps"] == r1["steps"] == 6
    offered = r0["offered_utts"] + r1["offered_utts"]
    assert offered == (5 + 3) * 5
    for e0, e1 in zip(r0["epochs"], r1["epochs"]):
        assert e0["steps"] == e1["steps"] == 3
        assert (e0["dropped"], e1["dropped"]) == (2, 0)
        assert (e0["dropped_utts"], e1["dropped_utts"]) == (8, 0)
        assert (e0["local_skipped"], e1["local_skipped"]) == (5, 3)  # a dropped batch's skip counts still count
        for key in ("global_utts", "global_dropped_utts", "global_skipped"):
            assert e0[key] == e1[key]  # reduced: every rank holds the job's totals
        assert e0["global_utts"] == 24 and e0["global_dropped_utts"] == 8 and e0["global_skipped"] == 8
        assert e0["global_utts"] + e0["global_dropped_utts"] + e0["global_skipped"] == offered
        if join_mode == "monitored_barrier":
            assert (e0["missing_ranks"], e1["missing_ranks"]) == ("1", "")  # rank 1 had left the loop
    # Same parameters, same Adam moments, same LR on both ranks (DDP's model.join() would leave rank 1's
    # optimizer two steps behind).
    assert r0["params"] == r1["params"]
    assert r0["exp_avg"] == r1["exp_avg"]
    assert r0["lr"] == r1["lr"]


@pytest.mark.parametrize("join_mode", ["flag", "monitored_barrier"])
def test_a_rank_without_any_batch_trains_nobody_and_nothing_hangs(tmp_path, join_mode):
    # monitored_barrier exempts the first batch from the clock only: without its untimed flag, rank 0 would run
    # the first gradient all-reduce alone while rank 1 waits in the statistics reduction (a pg-timeout hang).
    proc = run_ranks(WORKER, str(tmp_path), "2", "0", "--join_mode", join_mode, "--join_timeout_s", "3",
                     timeout=150)  # the worker's pg timeout is 60 s: a hang fails there
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["steps"] == r1["steps"] == 0
    assert (r0["epochs"][0]["dropped"], r1["epochs"][0]["dropped"]) == (2, 0)
    assert r0["params"] == r1["params"]


def test_monitored_barrier_a_rank_slower_than_the_timeout_ends_the_epoch_for_all(tmp_path):
    # The documented flaw of join_mode monitored_barrier: even data (3 vs 3), rank 1 stalls 4 s before each batch,
    # longer than the 3 s join timeout. The first batch is exempt; the barrier before the second times out, so both
    # ranks train 1 batch of 3 (flag mode trains all 3: test_a_slow_rank_never_shortens_the_epoch).
    proc = run_ranks(WORKER, str(tmp_path), "3", "3", "--join_mode", "monitored_barrier", "--join_timeout_s", "3",
                     "--sleep_rank1_s", "4", timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["steps"] == r1["steps"] == 1
    assert r0["dropped"] == r1["dropped"] == 2
    assert r0["global_utts"] == 2 * 4 and r0["global_dropped"] == 4
    assert r0["epochs"][0]["missing_ranks"] == "1"
    assert r1["epochs"][0]["missing_ranks"] == "unknown"  # rank 1 only learns that rank 0 did not answer
    assert r0["params"] == r1["params"]


def test_join_mode_and_timeout_are_validated_with_the_choices_in_the_error():
    assert resolve_train_conf({}).join_mode == "flag"
    assert resolve_train_conf({}).join_timeout_s == 30.0
    with pytest.raises(ConfigError, match=r"join_mode: 'barrier' is not one of \['flag', 'monitored_barrier'\]"):
        resolve_train_conf({"join_mode": "barrier"})
    for bad, message in ((0, "must be a positive number"), (-1.0, "must be a positive number"),
                         (True, "expected a finite number"), ("5", "expected a finite number")):
        with pytest.raises(ConfigError, match=f"join_timeout_s.*{message}"):
            resolve_train_conf({"join_timeout_s": bad})
    with pytest.raises(ValueError, match="join_mode 'barrier' is not one of"):
        init_join(DistContext(), "barrier", 3.0)


def test_monitored_barrier_timeout_must_be_below_the_pg_timeout():
    # One in-process rank: a join timeout at or above the process-group timeout is refused up front.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=10))
    try:
        ctx = DistContext(pg_timeout=datetime.timedelta(seconds=10))
        with pytest.raises(ValueError, match=r"join_timeout_s \(10.0 s\) must be below the process-group timeout"):
            init_join(ctx, "monitored_barrier", 10.0)
        assert init_join(ctx, "monitored_barrier", 9.5).timeout.total_seconds() == 9.5
    finally:
        dist.destroy_process_group()
