"""A launcher killed with SIGKILL takes its training ranks with it (``stop_with_launcher``): 2 real gloo ranks
started through run.sh's launcher (``toolkit.bin.launch``) and through ``torchrun`` itself, the launcher killed
mid-training, every process it started gone within seconds, and the model dir's lock free for the next job."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from toolkit.utils.dir_lock import LOCK_FILE, DirLock

from test.helpers import REPO_ROOT, alive, descendants

from .workers.recipe_data import ENV, train_args, write_data

GONE_WITHIN_S = 5.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["toolkit.bin.launch", "torch.distributed.run"])
def test_the_ranks_end_with_a_killed_launcher_and_the_model_dir_is_free_again(tmp_path, launcher):
    write_data(tmp_path)
    model_dir = tmp_path / "exp"
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2",
           *train_args(tmp_path, model_dir, "train_conf.max_epoch 100")]
    proc = subprocess.Popen(cmd, env=ENV, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while not (model_dir / "init.pt").exists():  # written once the claim holds the lock and every check passed
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(0.5)
        started = descendants(proc.pid)
        holder = json.loads((model_dir / LOCK_FILE).read_text())["pid"]
        assert holder in started and len(started) >= 2  # rank 0, rank 1 (and their loader workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        while any(alive(pid) for pid in started) and time.monotonic() - killed < GONE_WITHIN_S:
            time.sleep(0.1)
        assert not [pid for pid in started if alive(pid)], f"orphans of {launcher} still run"
        lock = DirLock(str(model_dir), {"pid": os.getpid()})
        assert lock.acquire() is None  # the next job gets in
        lock.release()
    finally:  # no orphan outlives a failed test
        proc.kill()
        proc.wait()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
