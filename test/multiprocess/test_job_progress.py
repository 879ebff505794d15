"""Whole-job progress through the c10d store, with real gloo ranks under torchrun."""

import time

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_job_progress.py")


def test_every_rank_sees_the_whole_job_and_the_bar_counts_all_ranks():
    proc = run_ranks(WORKER, "count", nproc=3, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(3):  # finish() returns only when all ranks are done: each sees 3 x (1 + 2 + 3) units
        assert f"rank {rank} done: 18 units, 3 adds" in proc.stdout
    assert "18/18" in proc.stderr  # rank 0's bar, though rank 0 added only 3 of them


def test_a_failed_rank_ends_the_wait_of_the_others():
    start = time.monotonic()
    proc = run_ranks(WORKER, "fail", nproc=2, timeout=120)
    assert proc.returncode != 0
    assert "RuntimeError: another rank failed before finishing" in proc.stderr
    assert time.monotonic() - start < 50  # rank 1 sleeps 60 s: rank 0 did not wait for it
