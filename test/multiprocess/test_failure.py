"""A rank that fails makes the whole job exit non-zero, fast, with that rank's error in the log (2 real gloo ranks).

Raised error: torchrun already ends the job. Rank 1's process exits and gloo closes its sockets, so rank 0, waiting
in the join's all-reduce, fails about a second later with "Connection closed by peer"; torchrun, seeing rank 1
exit non-zero, SIGTERMs every worker still running and exits non-zero itself, naming rank 1 as the root cause.
Measured: the job ends ~4-5 s after the raise (2 busy cores), far inside the 60 s process-group timeout.

Blocked rank: a rank that is stuck but alive (a hung read) keeps its sockets open, and torchrun sees no failure.
Only the process-group timeout set by ``init_distributed(timeout_s=...)`` bounds that case: rank 0's collective
(here the flag join's all-reduce, on the join's own group, which inherits that timeout) fails after it, rank 0
exits non-zero, and torchrun then kills the blocked rank.
"""

import json
import os
import time

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_failure.py")


def _failed_at(out_dir) -> float:
    with open(os.path.join(out_dir, "rank1_failed_at.txt")) as f:
        return float(f.read())


def test_a_rank_that_raises_ends_the_job_nonzero_well_within_the_pg_timeout(tmp_path):
    pg_timeout_s = 60.0
    proc = run_ranks(WORKER, str(tmp_path), "raise", "--pg_timeout_s", str(pg_timeout_s), timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    assert "ValueError: rank 1 broke on purpose" in proc.stdout + proc.stderr
    after_failure_s = ended - _failed_at(tmp_path)
    print(f"job ended {after_failure_s:.1f} s after rank 1 raised (pg timeout {pg_timeout_s:.0f} s)")
    assert after_failure_s < pg_timeout_s / 2


def test_a_blocked_rank_is_bounded_by_the_pg_timeout(tmp_path):
    pg_timeout_s = 10.0
    proc = run_ranks(WORKER, str(tmp_path), "hang", "--pg_timeout_s", str(pg_timeout_s), timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    with open(os.path.join(tmp_path, "rank0_error.json")) as f:
        error = json.load(f)
    # Rank 1 blocks fetching its third batch, which the flag join looks up before the second step.
    assert error["steps"] == 1
    assert "Timed out" in error["message"], error
    waited_s = error["at"] - _failed_at(tmp_path)
    print(f"rank 0 failed {waited_s:.1f} s after rank 1 blocked; job ended {ended - error['at']:.1f} s later "
          f"(pg timeout {pg_timeout_s:.0f} s)")
    # The timeout, not torchrun and not luck, ends it: never before pg_timeout_s, and not long after (measured
    # 10.0 s; the bound leaves room for a loaded machine), where the join group's default would be 30 min.
    assert pg_timeout_s - 1.0 < waited_s < 2 * pg_timeout_s
    assert ended - error["at"] < 30.0
