"""Inputs and commands for running ``toolkit.bin.train`` in tests: tiny_fsdd data.lists (plus two lines with
missing audio, so that skip counts travel through checkpoints too), a char dict and CMVN stats made with the
recipe's tools, the torchrun command line, and the exact-resume comparison shared by both engines' tests."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import yaml

from toolkit.utils.checkpoint import load_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(REPO, "corpora", "tiny_fsdd")
CONF = os.path.join(REPO, "examples", "english", "s0", "conf", "train_tiny.yaml")
ENV = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}


def _kaldi(split: str) -> list[dict]:
    d = os.path.join(CORPUS, "data", split)
    wavs = dict(line.split() for line in open(os.path.join(d, "wav.scp")))
    texts = dict(line.strip().split(maxsplit=1) for line in open(os.path.join(d, "text")))
    return [{"key": k, "wav": os.path.join(CORPUS, wavs[k]), "txt": texts[k]} for k in sorted(wavs)]


def write_data(data_dir, num_train: int = 80) -> None:
    """``train.list`` (the first ``num_train`` of 80 utterances + 2 with missing audio), ``cv.list`` (20),
    ``units.txt`` (from all 80), ``cmvn``."""
    good = _kaldi("train")
    bad = [{"key": f"bad-missing-{i}", "wav": str(data_dir / f"nope{i}.wav"), "txt": "ONE"} for i in range(2)]
    for name, rows in (("train.list", good[:num_train] + bad), ("cv.list", _kaldi("dev"))):
        with open(data_dir / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    (data_dir / "text").write_text("".join(f"{r['key']} {r['txt']}\n" for r in good))
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_dict.py"), str(data_dir / "text"),
                    str(data_dir / "units.txt")], check=True, env=ENV, capture_output=True)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "compute_cmvn_stats.py"), "--train_config", CONF,
                    "--in_data_list", str(data_dir / "cv.list"), "--out_cmvn", str(data_dir / "cmvn")],
                   check=True, env=ENV, capture_output=True)


def train_args(data_dir, model_dir, *overrides: str) -> list[str]:
    """``toolkit.bin.train`` arguments: train_tiny.yaml with batch 8 (5 optimizer steps per epoch and rank)."""
    args = ["-m", "toolkit.bin.train", "--config", CONF, "--train_data", str(data_dir / "train.list"),
            "--cv_data", str(data_dir / "cv.list"), "--model_dir", str(model_dir),
            "--tensorboard_dir", str(model_dir / "tb"), "--pg_timeout_s", "300"]
    for item in (f"tokenizer_conf.symbol_table_path {data_dir / 'units.txt'}",
                 f"cmvn_conf.cmvn_file {data_dir / 'cmvn'}", "dataset_conf.batch_conf.batch_size 8",
                 "train_conf.log_interval 1", *overrides):
        args += ["--override_config", item]
    return args


def run_standalone(args: list[str], timeout: float, nproc: int = 2) -> subprocess.CompletedProcess:
    """One torchrun job of ``nproc`` gloo ranks on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)


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


def uninterrupted_and_resumed(tmp_path, *engine_args):
    """Run 2 epochs with step checkpoints every 4 steps; resume a copy of ``step_8`` in a fresh model dir."""
    write_data(tmp_path)
    overrides = ("train_conf.max_epoch 2", "train_conf.save_interval_steps 4")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = run_standalone(train_args(tmp_path, full, *overrides) + list(engine_args), TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert yaml.safe_load(open(full / "step_8.yaml"))["batches_in_epoch"] == 3  # epoch 1, mid-way
    path = copy_checkpoint(full, resumed, "step_8")
    proc = run_standalone(train_args(tmp_path, resumed, *overrides) + list(engine_args) + ["--checkpoint", path],
                          TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr and "after 3 of its batches, step 8" in proc.stderr
    assert not os.path.exists(resumed / "epoch_0.pt")  # epoch 0 was done before the checkpoint
    return full, resumed


def assert_same_epoch_1(full, resumed):
    info_full, info_resumed = (yaml.safe_load(open(d / "epoch_1.yaml")) for d in (full, resumed))
    assert info_full["step"] == 10 and info_full["skipped"] == {"missing_audio": 2, "too_few_encoder_frames": 2}
    assert info_resumed == info_full  # train_loss is exact only if the pre-checkpoint sums were restored
    assert_bit_identical(load_checkpoint(str(full / "epoch_1.pt")), load_checkpoint(str(resumed / "epoch_1.pt")))
