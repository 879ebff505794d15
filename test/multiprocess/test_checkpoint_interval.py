"""``save_interval_minutes`` on 2 real gloo ranks: global rank 0's clock decides and the decision is broadcast, so
a rank whose clock is an hour ahead saves at exactly the same optimizer steps (a rank deciding on its own clock
would enter the collective save alone and hang the job)."""

import os

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_clock.py")


def test_rank_0_clock_decides_minute_checkpoints(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = read_rank_reports(tmp_path, 2)
    assert reports[0] == reports[1]
    saved = reports[0]["saved"]
    # 10 steps of >= 0.3 s with a 2 s interval: a few saves, never at step 1 (rank 1's skewed clock would say so).
    assert reports[0]["steps"] == 10 and 1 <= len(saved) <= 5 and "step_1" not in saved
    for tag in saved:
        assert os.path.exists(tmp_path / f"{tag}.yaml")
