"""The model dir must be one disk for every rank (2 real gloo ranks): a node-local directory at the same path stops
every rank at start, in one line naming the ranks that cannot see rank 0's files."""

import os

from toolkit.distributed.shared_dir import MARKER

from test.helpers import read_rank_reports

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_shared_dir.py")


def _reports(out_dir, dir0, dir1):
    proc = run_ranks(WORKER, str(out_dir), str(dir0), str(dir1), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_rank_reports(out_dir, 2)


def test_a_shared_model_dir_passes_and_is_left_clean(tmp_path):
    model_dir = tmp_path / "exp" / "model"  # created by rank 0
    assert _reports(tmp_path, model_dir, model_dir) == [{"ok": True}, {"ok": True}]
    assert os.listdir(model_dir) == []


def test_a_node_local_model_dir_stops_every_rank_even_with_an_old_marker(tmp_path):
    node0, node1 = tmp_path / "node0" / "exp", tmp_path / "node1" / "exp"
    node1.mkdir(parents=True)
    (node1 / MARKER).write_text("a token of an earlier run")  # an earlier run's marker must not pass
    reports = _reports(tmp_path, node0, node1)
    for report, path in zip(reports, (node0, node1)):  # the same path string on real nodes
        assert "ok" not in report
        assert report["error"].startswith(f"--model_dir {path} is not shared: rank 1 (")
        assert "rank 0" not in report["error"].split(" cannot see ")[0]  # rank 0 sees what it wrote
