"""A launcher killed with SIGKILL takes its training ranks with it (``stop_with_launcher``): 2 real gloo ranks
started through run.sh's launcher (``toolkit.bin.launch``), through ``torchrun`` itself and through run.sh, the
launcher (run.sh) killed mid-training, every process it started gone within seconds, and the model dir's lock free
for the next job."""

import json
import os
import subprocess
import sys
import time

import pytest

from toolkit.utils.dir_lock import LOCK_FILE, DirLock

from test.helpers import REPO_ROOT, descendants, kill, kill_all, outlived

from .workers.recipe_data import ENV, train_args, write_data

GONE_WITHIN_S = 5.0
# A forkserver notices that its rank is gone only once it has imported what it preloads (torch: seconds under load)
REST_GONE_WITHIN_S = 30.0


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def run_sh(data_dir, model_dir) -> list[str]:
    """run.sh's stage 4 on :func:`write_data`'s files, laid out as stages 1..3 leave them."""
    for src, dst in (("train.list", "train/data.list"), ("cv.list", "dev/data.list"), ("cmvn", "train/global_cmvn"),
                     ("units.txt", "dict/units.txt")):
        os.makedirs(data_dir / os.path.dirname(dst), exist_ok=True)
        os.replace(data_dir / src, data_dir / dst)
    return ["bash", os.path.join(REPO_ROOT, "run.sh"), "--stage", "4", "--stop_stage", "4", "--train_config",
            "conf/train_tiny.yaml", "--data", str(data_dir), "--dir", str(model_dir), "--tensorboard_dir",
            str(model_dir / "tb"), "--nproc_per_node", "2", "--overrides", "train_conf.max_epoch 100"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["toolkit.bin.launch", "torch.distributed.run", "run.sh"])
def test_the_ranks_end_with_a_killed_launcher_and_the_model_dir_is_free_again(tmp_path, launcher):
    write_data(tmp_path)
    model_dir = tmp_path / "exp"
    cmd = run_sh(tmp_path, model_dir) if launcher == "run.sh" else [
        sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2",
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
        ranks = {pid for pid in started if " -u -m toolkit.bin.train " in command_line(pid)}  # as torchrun starts them
        holder = json.loads((model_dir / LOCK_FILE).read_text())["pid"]
        assert holder in ranks and len(ranks) == 2, [command_line(pid) for pid in started]
        killed = kill(proc)
        assert not outlived(ranks, killed, GONE_WITHIN_S), f"ranks orphaned by {launcher} still run"
        # the rest (run.sh's launcher, a rank's forkserver still importing torch, its resource tracker) follow
        assert not [command_line(pid) for pid in outlived(started, killed, REST_GONE_WITHIN_S)]
        lock = DirLock(str(model_dir), {"pid": os.getpid()})
        assert lock.acquire() is None  # the next job gets in
        lock.release()
    finally:
        kill_all(proc, started)
