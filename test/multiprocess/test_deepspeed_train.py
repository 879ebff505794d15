"""DeepSpeed through ``toolkit.bin.train`` on real tiny_fsdd speech: bf16 on the CPU trains (both engines autocast the
same way, DeepSpeed's inside the model's forward: test/toolkit/engine/test_deepspeed_precision.py), plain
``python -m toolkit.bin.train`` without torchrun works with DeepSpeed as with DDP, and a ZeRO checkpoint resumed on
another number of ranks stops with one line instead of DeepSpeed's own traceback."""

import math
import subprocess
import sys

import yaml

from test.helpers import REPO_ROOT

from .workers.recipe_data import ENV, TIMEOUT_S, deepspeed_args, finished_job, session_data, train_args

DEEPSPEED = deepspeed_args(2)


def test_zero2_bf16_on_cpu_trains_and_another_world_size_is_refused_in_one_line(tmp_path):
    # the job test_activation_checkpointing.py compares against too
    exp, _ = finished_job(("train_conf.max_epoch 1", "train_conf.dtype bf16"), DEEPSPEED, num_train=16)
    info = yaml.safe_load(open(exp / "epoch_0.yaml"))
    # 18 lines make 3 batches of the epoch (8, 8 and the last 2 lines): rank 0's second is dropped at the join.
    assert (info["train_utts"], info["dropped_utts"], info["skipped"]) == (14, 2, {"missing_audio": 2})
    assert math.isfinite(info["train_loss"]) and math.isfinite(info["cv_loss"])
    # The same checkpoint, one process instead of two: ZeRO's optimizer state is split by rank.
    plain = [sys.executable] + train_args(session_data(16), tmp_path / "one", "train_conf.max_epoch 2",
                                          "train_conf.dtype bf16")
    proc = subprocess.run(plain + [*DEEPSPEED, "--checkpoint", str(exp / "epoch_0.pt")], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=ENV, cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert "written by 2 ranks and resumes on that many only" in proc.stderr and "Traceback" not in proc.stderr


def test_plain_python_without_torchrun_trains_with_deepspeed(tmp_path):
    exp = tmp_path / "plain"
    cmd = [sys.executable] + train_args(session_data(16), exp, "train_conf.max_epoch 1") + list(DEEPSPEED)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert yaml.safe_load(open(exp / "epoch_0.yaml"))["train_utts"] == 16
