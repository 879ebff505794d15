"""toolkit.bin.train in one process (plain ``python -m``) on the real tiny corpora: an utterance no CTC alignment fits
is named and counted, a resume leaves one tensorboard value per step, and a nonsense grad_clip stops in one line."""

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from toolkit.text.tokenizer import write_symbol_table

from test.helpers import REPO_ROOT, kaldi_entries

CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "train_tiny.yaml")
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def run(args, cwd, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


def cmvn(tmp_path, data_list):
    proc = run([os.path.join(REPO_ROOT, "tools", "compute_cmvn_stats.py"), "--train_config", CONF, "--in_data_list",
                str(data_list), "--out_cmvn", str(tmp_path / "cmvn")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def train(tmp_path, train_list, cv_list, *overrides):
    args = ["-m", "toolkit.bin.train", "--config", CONF, "--train_data", str(train_list), "--cv_data", str(cv_list),
            "--model_dir", str(tmp_path / "exp"), "--tensorboard_dir", str(tmp_path / "tb")]
    overrides = (f"tokenizer_conf.symbol_table_path {tmp_path / 'units.txt'}",
                 f"cmvn_conf.cmvn_file {tmp_path / 'cmvn'}", *overrides)
    for override in overrides:
        args += ["--override_config", override] if not override.startswith("--") else override.split(" ", 1)
    return run(args, tmp_path)


def test_an_utterance_without_ctc_alignment_is_named_and_counted(tmp_path):
    # The ctc-impossible case: three 3 s segments of real speech and short014, 0.14 s (12 fbank frames = 2 encoder
    # frames) with 10 characters, which no CTC alignment can fit. zero_infinity used to score it 0, unreported.
    wav = os.path.join(REPO_ROOT, "corpora", "tiny_lj", "wav")
    rows = [{"key": f"long{i}", "wav": f"{wav}/LJ001-0001.wav", "txt": "PRINTING IN THE ONLY", "start": 3.0 * i,
             "end": 3.0 * i + 3.0} for i in range(3)]
    rows.append({"key": "short014", "wav": f"{wav}/LJ001-0002.wav", "txt": "COMPARATIV", "start": 0.5, "end": 0.64})
    data = tmp_path / "data.list"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_symbol_table(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + ["\u2581", "'"], str(tmp_path / "units.txt"))
    cmvn(tmp_path, data)
    # Padding off: the recipe's 0.5 s (11 encoder frames) would fit these 10 characters.
    proc = train(tmp_path, data, data, "train_conf.max_epoch 1", "dataset_conf.batch_conf.batch_size 4",
                 "dataset_conf.shuffle false", "dataset_conf.pad_conf.min_length 0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = yaml.safe_load(open(tmp_path / "exp" / "epoch_0.yaml"))
    assert info["skipped"] == {"too_few_encoder_frames": 1} and info["cv_skipped"] == {"too_few_encoder_frames": 1}
    assert info["train_utts"] == 3 and info["cv_utts"] == 3  # 3 trained + 1 skipped = the 4 offered
    named = [line for line in proc.stderr.splitlines() if "short014" in line]
    assert len(named) == 2 and all("too_few_encoder_frames" in line for line in named)  # training and CV
    assert 0 < info["train_loss"] < 1000 and 0 < info["cv_loss"] < 1000


@pytest.mark.multiprocess  # 2 epochs, then a resume: two training processes (~90 s on a busy 2-core machine)
def test_a_resume_leaves_one_tensorboard_value_per_step(tmp_path):
    # The tensorboard-resume case: 2 epochs (steps 1-10), then a resume from epoch_0.pt into the same directories.
    train_rows = kaldi_entries("tiny_fsdd", "train")
    for name, entries in (("train.list", train_rows[:40]), ("cv.list", kaldi_entries("tiny_fsdd", "dev"))):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in entries))
    write_symbol_table(sorted(set("".join(row["txt"] for row in train_rows))), str(tmp_path / "units.txt"))
    cmvn(tmp_path, tmp_path / "cv.list")
    overrides = ("dataset_conf.batch_conf.batch_size 8", "train_conf.log_interval 1", "train_conf.max_epoch 2")
    first = train(tmp_path, tmp_path / "train.list", tmp_path / "cv.list", *overrides)
    assert first.returncode == 0, first.stderr[-4000:]
    resumed = train(tmp_path, tmp_path / "train.list", tmp_path / "cv.list", *overrides,
                    f"--checkpoint {tmp_path / 'exp' / 'epoch_0.pt'}")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    run_dir = tmp_path / "tb" / "exp"
    assert len(glob.glob(str(run_dir / "events.*"))) == 2
    events = EventAccumulator(str(run_dir))
    events.Reload()
    # Every tag keyed by the optimizer step; the abandoned run's points after step 5 are purged.
    for tag, steps in (("train/loss", list(range(1, 11))), ("cv/loss", [5, 10]), ("train/epoch_loss", [5, 10])):
        assert [e.step for e in events.Scalars(tag)] == steps, tag
    cv_loss = yaml.safe_load(open(tmp_path / "exp" / "epoch_1.yaml"))["cv_loss"]
    assert abs(events.Scalars("cv/loss")[1].value - cv_loss) < 1e-4 * cv_loss
    # The abandoned run's checkpoints after epoch_0 were moved aside before the resumed run wrote anything.
    assert sorted(os.listdir(tmp_path / "exp" / "previous_runs" / "1")) == ["epoch_1.pt", "epoch_1.yaml"]
    assert "(trained after --checkpoint " in resumed.stderr


def test_a_nonsense_grad_clip_stops_in_one_line_before_anything_is_written(tmp_path):
    write_symbol_table(list("ONE"), str(tmp_path / "units.txt"))
    proc = train(tmp_path, tmp_path / "none.list", tmp_path / "none.list", "train_conf.grad_clip .nan")
    assert proc.returncode == 2
    assert "train_conf.grad_clip: expected a finite number" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "exp" / "train.yaml").exists()
