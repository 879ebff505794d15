"""The recipe on several machines and under a fault, through ``run.sh`` as users run it (stage 4, tiny_fsdd, the tiny
conformer): two "nodes" on loopback for both engines, a node that never arrives, and a rank killed with SIGKILL in the
middle of an epoch under ``--max_restarts`` (and ``--start_over``, in a dir holding an earlier run), whose job must
end bit-identical to one that was never interrupted."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter

import pytest
import yaml

from toolkit.utils.checkpoint import load_checkpoint

from test.helpers import REPO_ROOT, free_port

from ..multiprocess.workers.recipe_data import assert_bit_identical

pytestmark = pytest.mark.multiprocess  # two nodes' torchrun agents and their ranks (and the recipe tier: test/recipes/)
RUN_SH = os.path.join(REPO_ROOT, "run.sh")
LAUNCH = os.path.join(REPO_ROOT, "tools", "launch_nodes.sh")
TIMEOUT_S = 300  # one job: well under a minute on 2 idle cores; a hang fails here, with the job's output
DEEPSPEED = ("--train_engine", "deepspeed", "--deepspeed_config", "conf/ds_stage2.json")
# batch 8: 5 optimizer steps per epoch and rank; step_4 is the epoch's 4th batch
RESTART_OVERRIDES = "dataset_conf.batch_conf.batch_size 8;train_conf.max_epoch 2;train_conf.save_interval_steps 4"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Stages -1..3 of the recipe on tiny_fsdd (Kaldi dirs, CMVN, char dictionary, data.list)."""
    root = tmp_path_factory.mktemp("recipe")
    proc = subprocess.run(["bash", RUN_SH, "--stage", "-1", "--stop_stage", "3", "--corpora", "tiny_fsdd",
                           "--data", str(root / "data"), "--dir", str(root / "unused")],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "data"


def start_job(cmd: list[str]) -> subprocess.Popen:
    """``cmd`` with its output captured and ``TOOLKIT_TEST_RUN`` (``proc.run_id``) in its environment, which every
    process of the job inherits: torchrun starts its workers in sessions of their own, so the id is how
    :func:`finish` finds them all."""
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TOOLKIT_TEST_RUN": run_id})
    proc.run_id = run_id
    return proc


def stage4(data, exp, *options) -> subprocess.Popen:
    """``run.sh --stage 4 --stop_stage 4`` on the tiny conformer."""
    return start_job(["bash", RUN_SH, "--stage", "4", "--stop_stage", "4", "--train_config", "conf/train_tiny.yaml",
                      "--data", str(data), "--dir", str(exp), "--tensorboard_dir", str(exp / "tb"), *options])


def _pids_of(run_id: str, *env_entries: str) -> list[int]:
    """The processes whose environment holds ``TOOLKIT_TEST_RUN=run_id`` and every one of ``env_entries``."""
    wanted = {f"TOOLKIT_TEST_RUN={run_id}".encode(), *(entry.encode() for entry in env_entries)}
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= env:
            pids.append(int(pid))
    return pids


def finish(procs) -> tuple[list[int], list[str]]:
    """Wait for the jobs; one still running after TIMEOUT_S fails the test with its output, and no process of any
    job outlives this call."""
    try:
        outs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            _kill_job(proc)
        outs = [proc.communicate()[0] for proc in procs]
        pytest.fail(f"a job ran past {TIMEOUT_S} s; its output:\n" + "\n".join(out[-4000:] for out in outs))
    finally:
        for proc in procs:
            _kill_job(proc)
    return [proc.returncode for proc in procs], outs


def _kill_job(proc: subprocess.Popen) -> None:
    for pid in _pids_of(proc.run_id):
        with contextlib.suppress(ProcessLookupError):  # ended since it was listed
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("engine", [(), DEEPSPEED], ids=["torch_ddp", "deepspeed_zero2"])
def test_two_nodes_on_loopback_train_and_write_each_checkpoint_once(data, tmp_path, engine):
    # Started as on two machines: tools/launch_nodes.sh with a stand-in ssh that runs the command here.
    fake_ssh, hostfile = tmp_path / "ssh", tmp_path / "hosts"
    fake_ssh.write_text('#!/usr/bin/env bash\nexec bash -c "$2"\n')
    fake_ssh.chmod(0o755)
    hostfile.write_text("node-a\nnode-b\n")
    exp = tmp_path / "exp"  # one model dir, as on a shared disk
    command = " ".join(["bash", RUN_SH, "--stage 4 --stop_stage 4 --train_config conf/train_tiny.yaml",
                        "--data", str(data), "--dir", str(exp), "--tensorboard_dir", str(exp / "tb"),
                        "--num_nodes $NUM_NODES --HOST_NODE_ADDR $HOST_NODE_ADDR --nproc_per_node 1",
                        "--overrides 'train_conf.max_epoch 1'", *engine])
    proc = start_job([LAUNCH, "--hostfile", str(hostfile), "--ssh", str(fake_ssh),
                      "--host_node_addr", f"127.0.0.1:{free_port()}", "--", command])
    codes, logs = finish([proc])
    text = logs[0]
    assert codes == [0], text[-4000:]
    assert "[node-a] " in text and "[node-b] " in text  # each host's output, named
    assert "rank 0/2 (local 0/1)" in text and "rank 1/2 (local 0/1)" in text  # two nodes, one process each
    writes = re.findall(r"checkpoint: rank (\d+) wrote (\S+)", text)
    assert Counter(os.path.basename(path) for _, path in writes) == Counter(["init.pt", "epoch_0.pt"])
    assert {rank for rank, _ in writes} == {"0"}
    assert yaml.safe_load(open(exp / "epoch_0.yaml"))["epoch"] == 0


def test_a_node_that_never_arrives_ends_the_job_with_one_line(data, tmp_path):
    started = time.monotonic()
    codes, logs = finish([stage4(data, tmp_path / "exp", "--num_nodes", "2", "--nproc_per_node", "1",
                                 "--HOST_NODE_ADDR", f"127.0.0.1:{free_port()}", "--rdzv_timeout_s", "5")])
    assert codes[0] != 0
    assert "not all 2 nodes joined the rendezvous at 127.0.0.1:" in logs[0]
    assert "within --rdzv_timeout_s 5" in logs[0]
    assert time.monotonic() - started < 120


def _kill_rank_1_after(exp, tag: str, proc: subprocess.Popen) -> None:
    """SIGKILL local rank 1 as soon as checkpoint ``tag`` is committed (its .yaml exists)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (exp / f"{tag}.yaml").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before the checkpoint"
        time.sleep(0.01)
    # the worker itself, not its loader workers (the same environment): the one whose parent is torchrun's agent
    ranks = _pids_of(proc.run_id, "LOCAL_RANK=1")
    (pid,) = [pid for pid in ranks if _parent(pid) not in ranks]
    os.kill(pid, signal.SIGKILL)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("engine", [(), DEEPSPEED], ids=["torch_ddp", "deepspeed_zero2"])
def test_a_killed_rank_restarts_and_the_job_ends_bit_identical(data, tmp_path, engine):
    options = ("--max_restarts", "1", "--overrides", RESTART_OVERRIDES, *engine)
    full, killed = tmp_path / "full", tmp_path / "killed"
    started = time.monotonic()
    codes, logs = finish([stage4(data, full, *options)])
    full_s = time.monotonic() - started
    assert codes == [0], logs[0][-4000:]
    killed.mkdir()  # holding an earlier run, which the first attempt moves aside and its restart leaves alone
    earlier = ["epoch_0.pt", "epoch_0.yaml", "train.yaml"]
    for name in earlier:
        shutil.copy(full / name, killed / name)
    proc = stage4(data, killed, *options, "--start_over", "true")
    started = time.monotonic()
    _kill_rank_1_after(killed, "step_4", proc)
    codes, logs = finish([proc])
    log = logs[0]
    assert codes == [0], log[-4000:]
    killed_s = time.monotonic() - started
    print(f"uninterrupted {full_s:.1f} s; killed at step_4 and restarted {killed_s:.1f} s: the restart cost "
          f"{killed_s - full_s:.1f} s")
    # resumed mid-epoch: epoch 0 after 4 of its 5 batches (or, had the kill come later, still before epoch_0)
    assert re.search(r"resumed from \S+/step_4\.pt: epoch 0 after 4 of its batches, step 4", log), log[-4000:]
    assert os.listdir(killed / "previous_runs") == ["1"] and sorted(os.listdir(killed / "previous_runs/1")) == earlier
    for tag in ("epoch_0", "epoch_1"):
        assert yaml.safe_load(open(full / f"{tag}.yaml")) == yaml.safe_load(open(killed / f"{tag}.yaml"))
        assert_bit_identical(load_checkpoint(str(full / f"{tag}.pt")), load_checkpoint(str(killed / f"{tag}.pt")),
                             tag)


def test_a_job_that_keeps_failing_stops_after_max_restarts(data, tmp_path):
    # a CV list whose every audio file is gone: each attempt trains, then finds no CV utterance (a failure only the
    # ranks can see: run.sh's up-front checks refuse a damaged checkpoint before any rank)
    failing = tmp_path / "data"
    shutil.copytree(data, failing)
    rows = [json.loads(line) for line in (failing / "dev" / "data.list").read_text().splitlines()]
    (failing / "dev" / "data.list").write_text("".join(json.dumps({**row, "wav": row["wav"] + ".gone"}) + "\n"
                                                        for row in rows))
    exp = tmp_path / "exp"
    codes, logs = finish([stage4(failing, exp, "--max_restarts", "1", "--overrides", RESTART_OVERRIDES)])
    assert codes[0] != 0
    assert logs[0].count("rank 0/2 (local 0/2)") == 2  # the first attempt and 1 restart, then it gives up
    assert f"epoch 0 cross-validated no utterance of {failing / 'dev' / 'data.list'}" in logs[0]
