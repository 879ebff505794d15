"""Uneven data (5 vs 3 batches) with the DeepSpeed engine on 2 real gloo ranks, in both join modes: no hang, the
same optimizer steps on both ranks, identical parameters, exact dropped counts (torch_ddp: ``test_join.py``)."""


import pytest

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_engine.py")


@pytest.mark.parametrize("stage,join_mode", [(0, "monitored_barrier"), (2, "flag"), (2, "monitored_barrier")])
def test_deepspeed_uneven_batches_stop_together(tmp_path, stage, join_mode):
    proc = run_ranks(WORKER, str(tmp_path), "5", "3", "--engine", "deepspeed", "--stage", str(stage),
                     "--join_mode", join_mode, "--join_timeout_s", "3", timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["steps"] == r1["steps"] == 3
    assert len(r0["losses"]) == len(r1["losses"]) == 3
    assert (r0["dropped"], r1["dropped"]) == (2, 0)
    assert (r0["dropped_utts"], r1["dropped_utts"]) == (8, 0)
    assert r0["local_utts"] == r1["local_utts"] == 12
    assert r0["params"] == r1["params"]
    assert r0["lr"] == r1["lr"]
