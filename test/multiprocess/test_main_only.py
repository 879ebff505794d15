"""Main-only sections with 2 real gloo ranks: run_on_main, nesting, and a collective inside a section that fails
fast with a message naming the call instead of hanging until the process-group timeout."""

import time

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_main_only.py")


def test_run_on_main_runs_func_once_then_post_func_on_the_others(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), "run_on_main", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert (r0["is_main"], r1["is_main"]) == (True, False)
    assert (r0["is_local_main"], r1["is_local_main"]) == (True, False)
    assert r0["result"] == "main ran prepare"
    assert r1["result"] == "prepared by main"  # read after main wrote it: the barrier ordered them


def test_nested_main_only_sections(tmp_path):
    proc = run_ranks(WORKER, str(tmp_path), "nested", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = read_rank_reports(tmp_path, 2)
    assert r0["result"] == "outer+inner" and r1["result"] is None


def test_collective_inside_a_main_only_section_fails_fast_naming_the_call(tmp_path):
    start = time.monotonic()
    proc = run_ranks(WORKER, str(tmp_path), "collective_inside", timeout=100)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "save_model is a collective" in proc.stderr and "save_on_main_only" in proc.stderr
    assert elapsed < 90  # the process-group timeout is 120 s: the job did not wait for it
    assert not (tmp_path / "epoch_0.pt").exists()
