"""Inputs and commands for running ``toolkit.bin.train`` in tests: tiny_fsdd data.lists (plus two lines with
missing audio, so that skip counts travel through checkpoints too), a char dict and CMVN stats made with the
recipe's tools, the torchrun command line, and the exact-resume comparison shared by both engines' tests."""

import functools
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import yaml

from toolkit.utils.checkpoint import load_checkpoint

from test.helpers import REPO_ROOT, kaldi_entries

CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "train_tiny.yaml")
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


@functools.cache
def units_and_cmvn() -> tuple[bytes, bytes]:
    """``units.txt`` (the char dictionary of the 80 training texts) and ``cmvn`` (the stats of the 20 cv
    utterances), made by the recipe's tools once per test session: the inputs never change, and each tool is a
    Python start with torch (8 s of a test on a slow 2-core machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        text, units, cv, cmvn = (os.path.join(tmp, name) for name in ("text", "units.txt", "cv.list", "cmvn"))
        with open(text, "w") as f:
            f.writelines(f"{r['key']} {r['txt']}\n" for r in kaldi_entries("tiny_fsdd", "train"))
        with open(cv, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kaldi_entries("tiny_fsdd", "dev"))
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "make_dict.py"), text, units], check=True,
                       env=ENV, capture_output=True)
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "compute_cmvn_stats.py"), "--train_config",
                        CONF, "--in_data_list", cv, "--out_cmvn", cmvn], check=True, env=ENV, capture_output=True)
        return open(units, "rb").read(), open(cmvn, "rb").read()


def write_data(data_dir, num_train: int = 80, extra: tuple[dict, ...] = ()) -> int:
    """``train.list`` (the first ``num_train`` of 80 utterances, then ``extra``, else 2 lines with missing audio),
    ``cv.list`` (20), ``text`` (the 80), ``units.txt`` (from the 80), ``cmvn`` (of the cv list); returns
    ``num_train``."""
    good = kaldi_entries("tiny_fsdd", "train")
    bad = extra or [{"key": f"bad-missing-{i}", "wav": str(data_dir / f"nope{i}.wav"), "txt": "ONE"}
                    for i in range(2)]
    for name, rows in (("train.list", good[:num_train] + list(bad)), ("cv.list", kaldi_entries("tiny_fsdd", "dev"))):
        with open(data_dir / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    (data_dir / "text").write_text("".join(f"{r['key']} {r['txt']}\n" for r in good))
    units, cmvn = units_and_cmvn()
    (data_dir / "units.txt").write_bytes(units)
    (data_dir / "cmvn").write_bytes(cmvn)
    return num_train


def train_args(data_dir, model_dir, *overrides: str) -> list[str]:
    """``toolkit.bin.train`` arguments: train_tiny.yaml with batch 8 (5 optimizer steps per epoch and rank), its
    padding of short clips off (the skip counts name the digits too short for a CTC alignment)."""
    args = ["-m", "toolkit.bin.train", "--config", CONF, "--train_data", str(data_dir / "train.list"),
            "--cv_data", str(data_dir / "cv.list"), "--model_dir", str(model_dir),
            "--tensorboard_dir", str(model_dir / "tb"), "--pg_timeout_s", "300"]
    for item in (f"tokenizer_conf.symbol_table_path {data_dir / 'units.txt'}",
                 f"cmvn_conf.cmvn_file {data_dir / 'cmvn'}", "dataset_conf.batch_conf.batch_size 8",
                 "train_conf.log_interval 1", "dataset_conf.pad_conf.min_length 0", *overrides):
        args += ["--override_config", item]
    return args


def deepspeed_args(stage: int) -> tuple[str, ...]:
    """``toolkit.bin.train``'s arguments for DeepSpeed with the recipe's ZeRO-``stage`` JSON (one spelling, so that
    :func:`finished_job` sees the same job where two tests ask for it)."""
    conf = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", f"ds_stage{stage}.json")
    return ("--train_engine", "deepspeed", "--deepspeed_config", conf)


def run_standalone(args: list[str], timeout: float, nproc: int = 2) -> subprocess.CompletedProcess:
    """One torchrun job of ``nproc`` gloo ranks on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO_ROOT)


TIMEOUT_S = 420  # one run: ~45 s on 2 idle cores, minutes on busy ones; a hang still fails here


def assert_bit_identical(a, b, where=""):
    """Recursive exact equality (``torch.equal`` for tensors) over nested dicts, lists, arrays and objects."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_bit_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif hasattr(a, "__dict__"):  # e.g. DeepSpeed's loss scaler object: no __eq__, compare its attributes
        assert type(a) is type(b), where
        assert_bit_identical(vars(a), vars(b), where)
    else:
        assert a == b, where


def copy_checkpoint(src_dir, dst_dir, tag: str) -> str:
    """The files a fresh job needs to resume ``tag``: ``.pt``, ``.yaml`` and (DeepSpeed) the shard directory."""
    os.makedirs(dst_dir, exist_ok=True)
    for suffix in (".pt", ".yaml"):
        shutil.copy(src_dir / f"{tag}{suffix}", dst_dir / f"{tag}{suffix}")
    if os.path.isdir(src_dir / tag):
        shutil.copytree(src_dir / tag, dst_dir / tag)
    return str(dst_dir / f"{tag}.pt")


RESUME_OVERRIDES = ("train_conf.max_epoch 2", "train_conf.save_interval_steps 4")
_SESSION_DIR = tempfile.TemporaryDirectory(prefix="toolkit-test-jobs-")  # removed when the test process exits
_JOBS = itertools.count()


def session_data(num_train: int = 80) -> pathlib.Path:
    """One :func:`write_data` directory per ``num_train`` for the jobs :func:`finished_job` shares."""
    data = pathlib.Path(_SESSION_DIR.name) / f"data{num_train}"
    if not data.exists():
        data.mkdir()
        write_data(data, num_train)
    return data


@functools.cache
def finished_job(overrides: tuple[str, ...], engine_args: tuple[str, ...] = (),
                 num_train: int = 80) -> tuple[pathlib.Path, str]:
    """A 2-rank job (:func:`train_args` with ``overrides``, then ``engine_args``) on :func:`session_data`, run once
    per test session for each set of arguments: several tests compare against the same job, and each job is ~25 s
    of process start-up alone on a slow 2-core machine. Returns its model dir, which callers only read, and its
    stderr."""
    model_dir = pathlib.Path(_SESSION_DIR.name) / f"job{next(_JOBS)}"
    proc = run_standalone(train_args(session_data(num_train), model_dir, *overrides) + list(engine_args), TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return model_dir, proc.stderr


def uninterrupted(*engine_args: str) -> tuple[pathlib.Path, str]:
    """:func:`finished_job` of 2 epochs with step checkpoints every 4 steps (``step_8``: epoch 1, mid-way)."""
    model_dir, stderr = finished_job(RESUME_OVERRIDES, engine_args)
    assert yaml.safe_load(open(model_dir / "step_8.yaml"))["batches_in_epoch"] == 3
    return model_dir, stderr


def uninterrupted_and_resumed(tmp_path, *engine_args):
    """:func:`uninterrupted`, and a copy of its ``step_8`` resumed in fresh processes in ``tmp_path/resumed``."""
    full, _ = uninterrupted(*engine_args)
    resumed = tmp_path / "resumed"
    path = copy_checkpoint(full, resumed, "step_8")
    proc = run_standalone(train_args(session_data(), resumed, *RESUME_OVERRIDES) + list(engine_args)
                          + ["--checkpoint", path], TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr and "after 3 of its batches, step 8" in proc.stderr
    assert not os.path.exists(resumed / "epoch_0.pt")  # epoch 0 was done before the checkpoint
    return full, resumed


def assert_same_epoch_1(full, resumed):
    info_full, info_resumed = (yaml.safe_load(open(d / "epoch_1.yaml")) for d in (full, resumed))
    assert info_full["step"] == 10 and info_full["skipped"] == {"missing_audio": 2, "too_few_encoder_frames": 2}
    assert info_resumed == info_full  # train_loss is exact only if the pre-checkpoint sums were restored
    assert_bit_identical(load_checkpoint(str(full / "epoch_1.pt")), load_checkpoint(str(resumed / "epoch_1.pt")))
