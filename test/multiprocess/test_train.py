"""toolkit.bin.train with 2 real gloo ranks on tiny_fsdd: bad input is skipped and counted, checkpoints are
committed per epoch, resume continues at the next epoch, and a bad config key stops with the valid keys."""

import json
import subprocess
import sys

import pytest
import yaml

from toolkit.models.registry import init_model
from toolkit.text.tokenizer import init_tokenizer
from toolkit.train_config import read_config
from toolkit.utils.checkpoint import MODEL_KEY, load_checkpoint

from test.helpers import kaldi_entries

from .workers.recipe_data import (CONF, ENV, finished_job, run_standalone, session_data, train_args,
                                  write_data as write_lists)


def write_data(tmp_path) -> int:
    """The distributed tests' tiny_fsdd lists with 4 bad utterances (missing audio, a corrupt WAV, an empty text, a
    char outside the dictionary) instead of theirs; returns the number of good ones."""
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk" * 10)
    good = kaldi_entries("tiny_fsdd", "train")
    bad = ({"key": "bad-missing", "wav": str(tmp_path / "nope.wav"), "txt": "ONE"},
           {"key": "bad-corrupt", "wav": str(corrupt), "txt": "TWO"},
           {"key": "bad-empty-text", "wav": good[0]["wav"], "txt": ""},
           {"key": "bad-unknown-char", "wav": good[1]["wav"], "txt": "ZERO 7"})
    return write_lists(tmp_path, len(good), bad)


def train(tmp_path, *extra):
    """2 ranks of :func:`train_args` on ``tmp_path``'s lists, 2 epochs, model dir ``tmp_path/exp``; ``extra`` last."""
    return run_standalone(train_args(tmp_path, tmp_path / "exp", "train_conf.max_epoch 2") + list(extra), 300)


def test_train_skips_bad_input_commits_epochs_and_resumes(tmp_path):
    num_good = write_data(tmp_path)
    proc = train(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    exp = tmp_path / "exp"
    info = yaml.safe_load(open(exp / "epoch_1.yaml"))
    # nicolas-8-00/01 (EIGHT, 4 encoder frames) and yweweler-6-01 (SIX, 2) are too short for any CTC alignment.
    assert info["epoch"] == 1 and info["cv_utts"] == 19 and info["cv_skipped"] == {"too_few_encoder_frames": 1}
    assert info["skipped"] == {"missing_audio": 1, "unreadable_audio": 1, "empty_text": 1, "unknown_token": 1,
                               "too_few_encoder_frames": 2}
    # Every good utterance is trained on, except the two without a CTC alignment and whole batches dropped by the
    # join: the epoch's 84 lines make 11 batches, 10 of 8 and the last 4, so rank 0 holds one more than rank 1.
    assert info["train_utts"] == num_good - 2 - 4 and info["dropped_utts"] == 4
    for key in ("bad-missing", "bad-corrupt", "bad-empty-text", "bad-unknown-char", "nicolas-8-00", "nicolas-8-01",
                "yweweler-6-01"):
        assert key in proc.stderr  # each skip is logged with its key
    # train.yaml alone rebuilds the trained model: its overrides applied, the vocabulary from its symbol table.
    saved = read_config(str(exp / "train.yaml"))
    assert saved.train_conf.max_epoch == 2 and saved.dataset_conf.batch_conf.batch_size == 8
    tokenizer = init_tokenizer(saved.tokenizer, saved.tokenizer_conf)
    assert tokenizer.vocab_size() == len(open(tmp_path / "units.txt").readlines())
    init_model(saved, saved.input_dim, tokenizer.vocab_size()).load_state_dict(
        load_checkpoint(str(exp / "epoch_1.pt"))[MODEL_KEY])
    step_after_2 = info["step"]

    proc = train(tmp_path, "--checkpoint", str(exp / "epoch_0.pt"), "--override_config", "train_conf.max_epoch 3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stderr
    resumed = yaml.safe_load(open(exp / "epoch_2.yaml"))
    assert resumed["epoch"] == 2
    assert resumed["step"] == step_after_2 + info["step"] // 2  # epochs 1 and 2 after epoch 0's steps


def test_unknown_config_key_stops_with_the_valid_keys(tmp_path):
    proc = train(tmp_path, "--override_config", "train_conf.max_epochs 3")
    assert proc.returncode != 0
    assert "unknown key 'max_epochs'" in proc.stderr and "'max_epoch'" in proc.stderr


def test_an_epoch_that_trains_no_utterance_stops_the_job(tmp_path):
    write_data(tmp_path)
    bad = [json.loads(line) for line in open(tmp_path / "train.list") if '"bad-' in line]
    (tmp_path / "train.list").write_text("".join(json.dumps(r) + "\n" for r in bad))  # only unusable lines
    proc = train(tmp_path, "--override_config", "train_conf.max_epoch 1")
    assert proc.returncode != 0
    assert "epoch 0 trained no utterance" in proc.stderr and "skipped" in proc.stderr
    assert not (tmp_path / "exp" / "epoch_0.yaml").exists()


def test_a_mid_epoch_checkpoint_refuses_another_batch_size(tmp_path):
    write_data(tmp_path)
    proc = train(tmp_path, "--override_config", "train_conf.max_epoch 1",
                 "--override_config", "train_conf.save_interval_steps 2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    step = tmp_path / "exp" / "step_2.pt"
    assert yaml.safe_load(open(tmp_path / "exp" / "step_2.yaml"))["batches_in_epoch"] == 2
    # Its position (2 batches of 8) would mean other utterances with batches of 4: refused on every rank.
    proc = train(tmp_path, "--checkpoint", str(step), "--override_config", "dataset_conf.batch_conf.batch_size 4")
    assert proc.returncode != 0
    assert "stops inside epoch 0" in proc.stderr and "epoch_N.pt" in proc.stderr
    proc = train(tmp_path, "--checkpoint", str(tmp_path / "exp" / "nope.pt"))
    assert proc.returncode != 0 and "no such file" in proc.stderr


@pytest.mark.parametrize("override, message", [
    ("train_conf.dtype fp16", "train_conf.dtype fp16 needs a GPU"),
    ("optim_conf.lr .nan", "optim_conf.lr must be finite"),
    ("optim_conf.lr -0.1", "optim_conf: Invalid learning rate: -0.1"),
    ("model_conf.ctc_weight 1.5", "model_conf: ctc_weight must be in [0, 1]"),
    ("cmvn_conf.cmvn_file nope.json", "cmvn_conf.cmvn_file nope.json: No such file"),
])
def test_a_bad_value_stops_in_one_line_before_anything_is_written(tmp_path, override, message):
    write_data(tmp_path)
    cmd = [sys.executable, "-m", "toolkit.bin.train", "--config", CONF, "--train_data", str(tmp_path / "train.list"),
           "--cv_data", str(tmp_path / "cv.list"), "--model_dir", str(tmp_path / "exp"),
           "--override_config", f"tokenizer_conf.symbol_table_path {tmp_path / 'units.txt'}",
           "--override_config", f"cmvn_conf.cmvn_file {tmp_path / 'cmvn'}", "--override_config", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "exp").exists()  # no train.yaml, no checkpoint of a run that never started


def test_the_data_setup_of_a_resumed_run_is_the_one_its_own_step_checkpoints_stand_for(tmp_path):
    write_data(tmp_path)
    proc = train(tmp_path, "--override_config", "train_conf.max_epoch 1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    exp = tmp_path / "exp"
    # A new batch size from an epoch boundary is fine; this run's step checkpoints then count batches of 4 ...
    proc = train(tmp_path, "--checkpoint", str(exp / "epoch_0.pt"), "--override_config", "train_conf.max_epoch 2",
                 "--override_config", "dataset_conf.batch_conf.batch_size 4",
                 "--override_config", "train_conf.save_interval_steps 3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    step = sorted(exp.glob("step_*.yaml"), key=lambda p: int(p.stem.split("_")[1]))[0]
    step_info = yaml.safe_load(open(step))
    assert step_info["epoch"] == 1 and step_info["batches_in_epoch"] > 0
    # ... so resuming one of them with batches of 4 continues inside its epoch, and with 8 is refused.
    proc = train(tmp_path, "--checkpoint", str(step.with_suffix(".pt")), "--override_config",
                 "train_conf.max_epoch 2", "--override_config", "dataset_conf.batch_conf.batch_size 4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"epoch 1 after {step_info['batches_in_epoch']} of its batches" in proc.stderr
    proc = train(tmp_path, "--checkpoint", str(step.with_suffix(".pt")), "--override_config",
                 "train_conf.max_epoch 2")
    assert proc.returncode != 0 and "stops inside epoch 1" in proc.stderr


def test_bucket_batches_of_two_sizes_are_dealt_so_that_the_join_drops_none():
    # Bucket batching makes batches of 8 clips under 0.6 s and of 2 longer ones. Dealt to the rank with the fewest
    # lines (before), one rank held a batch more than the other and the join dropped its 4 utterances; dealt by
    # batches, every line is trained or skipped for a reason.
    bucket = "dataset_conf.batch_conf {batch_type: bucket, bucket_boundaries: [60], bucket_batch_sizes: [8, 2]}"
    exp, _ = finished_job(("train_conf.max_epoch 1", bucket))
    info = yaml.safe_load(open(exp / "epoch_0.yaml"))
    assert (info["dropped_batches"], info["dropped_utts"]) == (0, 0)
    lines = len(open(session_data() / "train.list").readlines())
    assert info["train_utts"] + sum(info["skipped"].values()) == lines == 82
