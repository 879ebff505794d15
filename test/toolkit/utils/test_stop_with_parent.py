"""A worker ends with the process that started it, ``kill -9`` included (``stop_with_parent``): the tools'
``ProcessPoolExecutor`` pools (re-encoding, shards) on real tiny_fsdd audio, their tool killed mid-work, every worker
gone within seconds; without it a worker waits for work for good, orphaned. (``compute_stats``' ``multiprocessing.Pool``
workers end by themselves when their parent is killed: measured, 2026-12-07.)"""

import os
import subprocess
import sys
import time

import pytest

from test.helpers import REPO_ROOT, descendants, kill, kill_all, outlived

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
GONE_WITHIN_S = 5.0
# Each tool's work on the 80 tiny_fsdd training utterances, 40 times over (unique keys): tens of seconds, so that
# it is still running when killed.
ENTRIES = ("from test.helpers import kaldi_entries\n"
           "entries = [dict(e, key=f\"{e['key']}-{i}\") for i in range(40)\n"
           "           for e in kaldi_entries('tiny_fsdd', 'train')]\n")
TOOLS = {
    "reencode_audio": "import sys\nfrom toolkit.dataset.data_list import reencode_audio\n"
                      "reencode_audio(entries, sys.argv[1], 'flac', 2)\n",
    "make_shards": "import sys\nfrom toolkit.dataset.shard import make_shards\n"
                   "make_shards(entries, sys.argv[1], 4, 2, audio_format='flac')\n",
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_killed_tool_leaves_no_pool_worker_behind(tmp_path, tool):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", ENTRIES + TOOLS[tool], str(tmp_path / "out")], env=env,
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2:  # both started (a forked worker runs the pool's initializer first)
            assert proc.poll() is None and time.monotonic() < deadline, "the pool never started"
            workers = descendants(proc.pid)
            time.sleep(0.2)
        time.sleep(1.0)
        assert not outlived(workers, kill(proc), GONE_WITHIN_S), f"{tool}'s workers outlived it"
    finally:
        kill_all(proc, workers)
