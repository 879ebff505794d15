"""``toolkit.bin.train --check_only`` (what run.sh runs before any stage): the config with its overrides and the
decoding modes are checked in one process that writes nothing; the answer is one line, an error one line and exit 1.
run.sh's own messages are tested in test/recipes/test_run_sh_options.py."""

import os

import pytest
import torch

from toolkit.bin.train import main

from test.helpers import REPO_ROOT

CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "train_tiny.yaml")


def test_it_prints_max_epoch_gpus_and_whether_a_mode_uses_the_lm(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["--check_only", "--config", CONF, "--override_config", "train_conf.max_epoch 7",
          "--decode_modes", "ctc_greedy_search attention_rescoring"])
    assert capsys.readouterr().out == f"7 {torch.cuda.device_count()} 1\n"
    main(["--check_only", "--decode_modes", "ctc_greedy_search attention"])  # no config: the modes alone
    assert capsys.readouterr().out == f"0 {torch.cuda.device_count()} 0\n"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, message", [
    (["--decode_modes", "ctc_greedy_search beam"], "--decode_modes: unknown mode(s) ['beam']; choose from"),
    (["--decode_modes", " "], "--decode_modes: unknown mode(s) []"),
    (["--config", CONF, "--override_config", "scheduler_conf {warmup_steps: 2.5}"],
     "--config/--override_config: scheduler_conf: warmup_steps must be an integer"),
    (["--train_engine", "deepspeed"], "--deepspeed_config goes with --train_engine deepspeed, and only with it"),
    (["--deepspeed_config", "conf/ds_stage2.json"], "--deepspeed_config goes with --train_engine deepspeed"),
])
def test_an_error_is_one_line_and_exit_status_1(args, message):
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", *args])
    assert str(stop.value.code).startswith(message) and "\n" not in str(stop.value.code)


def test_a_run_still_needs_its_data_and_model_dir():
    with pytest.raises(SystemExit) as stop:
        main(["--config", CONF])
    assert stop.value.code == 2


def test_a_model_dir_holding_a_run_is_checked_as_the_run_would_check_it(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "train.yaml").write_text("encoder: conformer\n")  # a run killed before its first checkpoint
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", "--model_dir", str(exp)])
    assert str(stop.value.code) == (
        f"--model_dir {exp} holds an earlier run (train.yaml): continue it with --checkpoint auto, start a new one "
        f"there with --start_over (which moves the old one into {exp}/previous_runs/), or train into another "
        "--model_dir")
    for given in (["--checkpoint", "auto"], ["--start_over"]):
        main(["--check_only", "--model_dir", str(exp), *given])
        assert capsys.readouterr().out == f"0 {torch.cuda.device_count()} 0\n"
    main(["--check_only", "--model_dir", str(tmp_path / "new")])  # a dir to be made
    assert sorted(os.listdir(tmp_path)) == ["exp"] and os.listdir(exp) == ["train.yaml"]
