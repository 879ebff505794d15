"""``toolkit.bin.train --check_only`` (what run.sh runs before any stage): the config with its overrides and the
decoding modes are checked in one process that writes nothing; the answer is one line, an error one line and exit 1.
run.sh's own messages are tested in test/recipes/test_run_sh_options.py."""

import os

import pytest
import torch

from toolkit.bin.train import main
from toolkit.utils.checkpoint import load_checkpoint, save_checkpoint
from toolkit.utils.config_parsing import ConfigError

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recognize_setup import write_model

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
    # issue 48: FSDP options with another engine, and what torch_fsdp cannot run
    (["--config", CONF, "--override_config", "train_conf.fsdp_sharding_strategy zero3"],
     "train_conf.fsdp_sharding_strategy is a --train_engine torch_fsdp option (got --train_engine torch_ddp); "
     "remove it"),
    (["--config", CONF, "--train_engine", "deepspeed", "--deepspeed_config", "conf/ds_stage2.json",
      "--override_config", "train_conf.fsdp_cpu_offload false"],
     "train_conf.fsdp_cpu_offload is a --train_engine torch_fsdp option (got --train_engine deepspeed); remove it"),
    (["--config", CONF, "--override_config", "train_conf.fsdp_sharding_strategy zero1"],
     "--config/--override_config: train_conf.fsdp_sharding_strategy: 'zero1' is not one of ['zero2', 'zero3']"),
    (["--config", CONF, "--train_engine", "torch_fsdp", "--override_config", "train_conf.dtype fp16"],
     "train_conf.dtype fp16 is not supported with --train_engine torch_fsdp; use bf16"),
    (["--config", CONF, "--train_engine", "torch_fsdp", "--override_config", "train_conf.compile true"],
     "train_conf.compile true is not supported with --train_engine torch_fsdp"),
    (["--config", CONF, "--train_engine", "torch_fsdp", "--override_config", "train_conf.accum_grad 2",
      "--override_config", "train_conf.join_mode monitored_barrier"],
     "train_conf.accum_grad 2 with --train_engine torch_fsdp needs train_conf.join_mode flag"),
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


@pytest.fixture(scope="module")
def epoch_0(tmp_path_factory):
    """``exp/epoch_0.pt`` (committed) of train_tiny.yaml's model (encoder width 96), with its dictionary and CMVN
    stats, and the overrides that point the config at them."""
    data = tmp_path_factory.mktemp("data")
    _, init = write_model(data)
    exp = data / "exp"
    exp.mkdir()
    save_checkpoint(str(exp / "epoch_0.pt"), load_checkpoint(init), {"epoch": 0, "step": 5, "cv_loss": 9.0})
    inputs = [f"tokenizer_conf.symbol_table_path {data / 'units.txt'}", f"cmvn_conf.cmvn_file {data / 'cmvn'}"]
    return exp, [arg for item in inputs for arg in ("--override_config", item)]


@pytest.mark.parametrize("how", ["given", "auto"])
def test_a_checkpoint_of_another_model_is_refused_with_the_ranks_one_line(epoch_0, capsys, how):
    exp, inputs = epoch_0
    checkpoint = ["--checkpoint", str(exp / "epoch_0.pt")] if how == "given" else ["--checkpoint", "auto"]
    args = ["--check_only", "--config", CONF, *inputs, "--model_dir", str(exp), *checkpoint]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--override_config", "encoder_conf.output_size 64"])
    # what a rank's resume says (test_train_model_dir.py, through check_model_state), before any rank starts
    assert str(stop.value.code) == (
        f"{exp}/epoch_0.pt holds another model than this config's: encoder.embed.out.weight is (96, 608) in the "
        "checkpoint, (64, 608) in this config's model (104 keys differ); use the config it was trained with (the "
        "train.yaml beside it)")
    main(args)  # the config it was trained with
    assert capsys.readouterr().out == f"15 {torch.cuda.device_count()} 0\n"


def test_without_its_dictionary_yet_the_model_is_left_to_the_ranks(epoch_0, tmp_path, capsys):
    # run.sh from stage 2: the symbol table the model's size needs is made by this run; the ranks compare then
    exp, inputs = epoch_0
    main(["--check_only", "--config", CONF, *inputs, "--override_config", "encoder_conf.output_size 64",
          "--override_config", f"tokenizer_conf.symbol_table_path {tmp_path / 'units.txt'}",
          "--checkpoint", str(exp / "epoch_0.pt")])
    assert capsys.readouterr().out == f"15 {torch.cuda.device_count()} 0\n"

