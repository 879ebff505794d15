"""``toolkit.bin.train --check_only`` (what run.sh runs before any stage): the config with its overrides and the
decoding modes are checked in one process that writes nothing; the answer is one line, an error one line and exit 1.
run.sh's own messages are tested in test/recipes/test_run_sh_options.py."""

import os

import pytest
import torch

from toolkit.bin.train import main
from toolkit.utils.checkpoint import save_checkpoint
from toolkit.utils.config_parsing import ConfigError

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
    (["--decode_modes", "ctc_greedy_search beam"], "--decode_modes: unknown mode(s) ['beam']; choose one or more of"),
    (["--decode_modes", " "], "--decode_modes: no mode given; choose one or more of ['ctc_greedy_search', "),
    (["--decode_modes", ""], "--decode_modes: no mode given; choose one or more of ['ctc_greedy_search', "),
    (["--config", CONF, "--override_config", "scheduler_conf {warmup_steps: 2.5}"],
     "--config/--override_config: scheduler_conf: warmup_steps must be an integer"),
    (["--train_engine", "deepspeed"], "--deepspeed_config goes with --train_engine deepspeed, and only with it"),
    (["--deepspeed_config", "conf/ds_stage2.json"], "--deepspeed_config goes with --train_engine deepspeed"),
    # what only the ranks found, after torchrun started them (issue 45)
    (["--config", CONF, "--checkpoint", "exp/epoch_3.pt"],
     "--checkpoint exp/epoch_3.pt: no such file (--checkpoint auto resumes"),
    pytest.param(["--config", CONF, "--override_config", "train_conf.dtype fp16"],
                 "train_conf.dtype fp16 needs a GPU; use bf16 or fp32 on CPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is valid with a GPU")),
    (["--config", CONF, "--train_engine", "deepspeed", "--deepspeed_config", "none.json"],
     "--deepspeed_config none.json: file not found"),
])
def test_an_error_is_one_line_and_exit_status_1(args, message):
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", *args])
    assert str(stop.value.code).startswith(message) and "\n" not in str(stop.value.code)


def test_a_checkpoint_without_its_yaml_is_refused_before_any_rank(tmp_path):
    (tmp_path / "step_8.pt").write_bytes(b"")  # a save that never finished
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", "--config", CONF, "--checkpoint", str(tmp_path / "step_8.pt")])
    assert str(stop.value.code) == (f"--checkpoint {tmp_path / 'step_8.pt'}: no step_8.yaml beside it, so it is not "
                                    "a committed checkpoint (its save never finished); resume from another one")


def test_a_run_still_needs_its_data_and_model_dir():
    with pytest.raises(ConfigError, match="the following arguments are required: --train_data, --cv_data"):
        main(["--config", CONF])


def test_a_model_dir_holding_a_run_is_checked_as_the_run_would_check_it(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "train.yaml").write_text("encoder: conformer\n")  # a run killed before its first checkpoint
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", "--model_dir", str(exp)])
    assert str(stop.value.code) == (
        f"--model_dir {exp} holds an earlier run (train.yaml): continue it with --checkpoint auto, start a new one "
        f"there with --start_over (run.sh: --start_over true), which moves the old one into "
        f"{exp}/previous_runs/, or train into another "
        "--model_dir (run.sh: --dir)")
    for given in (["--checkpoint", "auto"], ["--start_over"]):
        main(["--check_only", "--model_dir", str(exp), *given])
        assert capsys.readouterr().out == f"0 {torch.cuda.device_count()} 0\n"
    main(["--check_only", "--model_dir", str(tmp_path / "new")])  # a dir to be made
    assert sorted(os.listdir(tmp_path)) == ["exp"] and os.listdir(exp) == ["train.yaml"]


def test_a_checkpoint_with_a_damaged_record_is_refused_before_any_rank(tmp_path):
    save_checkpoint(str(tmp_path / "epoch_2.pt"), {"model": {}}, {"epoch": 2})
    (tmp_path / "epoch_2.yaml").write_text("epoch: [2\n")  # overwritten by something else
    with pytest.raises(SystemExit) as stop:
        main(["--check_only", "--config", CONF, "--checkpoint", str(tmp_path / "epoch_2.pt")])
    assert str(stop.value.code).startswith(f"{tmp_path / 'epoch_2.yaml'} is not a readable checkpoint record: ")
