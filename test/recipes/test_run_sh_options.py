"""run.sh refuses what would otherwise surface only after training, or be ignored: one line, exit 1, before any
stage runs (the corpus dir given does not exist, so a check that let the run through would fail differently)."""

import os
import re
import shutil
import subprocess

import pytest
import torch

from toolkit.utils.checkpoint import load_checkpoint, save_checkpoint

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recognize_setup import write_model


@pytest.mark.parametrize("options, message", [
    (["--corpora", "fsdd", "kathleen"], "unexpected argument 'kathleen': every option takes one value"),
    (["--beam_size", "0"], "--beam_size must be a positive integer, got '0'"),
    (["--decode_batch_size", "x"], "--decode_batch_size must be a positive integer, got 'x'"),
    (["--decode_threads", "-1"], "--decode_threads must be a non-negative integer, got '-1'"),
    (["--train_config", "conf/train_tiny.yaml", "--overrides", "train_conf.max_epoch 2"],
     "--average_num 3 needs at least 3 epochs, but train_conf.max_epoch is 2"),
    (["--overrides", "train_conf.max_epok 2"], "unknown key 'max_epok' at train_conf"),
    (["--overrides", "scheduler warmupcosinlr"], "scheduler: 'warmupcosinlr' is not one of ['warmuplr', "
                                                 "'warmupcosinelr']"),
    (["--overrides", "scheduler_conf {warmup_steps: 2.5}"], "scheduler_conf: warmup_steps must be an integer"),
    (["--overrides", "optim_conf {lr: -1.0}"], "optim_conf: Invalid learning rate: -1.0"),
    (["--audio_format", "mp3"], "--audio_format must be keep, flac or wav, got 'mp3'"),
    (["--list_workers", "0"], "--list_workers must be a positive integer, got '0'"),
    (["--data_type", "shard", "--overrides", "scheduler warmupcosinelr"],
     "scheduler_conf.max_steps: warmupcosinelr needs the run's optimizer steps"),
    (["--stage", "4", "--stop_stage", "4", "--overrides", "train_conf.max_epoch x"], "train_conf.max_epoch"),
    (["--lm_order", "08"], "--lm_order must be 0 (no LM) or 2..6 (what KenLM loads), got '08'"),
    (["--lm_order", "1"], "--lm_order must be 0 (no LM) or 2..6 (what KenLM loads), got '1'"),
    (["--lm_weight", "0.5x"], "--lm_weight must be a decimal number, got '0.5x'"),
    (["--oov_penalty", "5"], "--oov_penalty must be <= 0, got '5'"),
    (["--stage", "5", "--decode_modes", ""], "--decode_modes: no mode given; choose one or more of "
                                            "['ctc_greedy_search', 'ctc_prefix_beam_search', 'attention', "),
    (["--decode_modes", "beam"], "--decode_modes: unknown mode(s) ['beam']; choose one or more of "),
    (["--length_penalty", "1,5"], "--length_penalty must be a decimal number, got '1,5'"),
    (["--reverse_weight", "1.5"], "--reverse_weight must be a number in [0, 1] (or empty: the model's), got '1.5'"),
    (["--reverse_weight", "09"], "--reverse_weight must be a number in [0, 1] (or empty: the model's), got '09'"),
    (["--spelling_order", "7"], "--spelling_order must be 0 (none) or 2..6 (what KenLM loads), got '7'"),
    (["--spelling_common_words", "-1"], "--spelling_common_words must be a non-negative integer, got '-1'"),
    (["--stage", "4", "--stop_stage", "4"], "data/train/global_cmvn is missing: training needs it; run the stages "
                                          "before --stage 4 first"),
    # the GPU configuration passes run.sh's config checks as shipped: the first stop is the missing data
    (["--train_config", "conf/train_conformer_gpu.yaml", "--stage", "4", "--stop_stage", "4"],
     "data/train/global_cmvn is missing: training needs it; run the stages before --stage 4 first"),
    (["--stage", "5"], "lm_3gram.arpa is missing: run stage 2 (--stage 2), or decode without LM (--lm_order 0)"),
    (["--stage", "5", "--lm_order", "0", "--corpora", "fsdd"],
     "data/test_fsdd/data.list is missing: stage 3 writes it for each of --corpora"),
    # what the ranks found under torchrun's traceback, or torchrun after 89 s of retries (issue 45)
    (["--train_engine", "ddp"], "error: train.py: argument --train_engine: invalid choice: 'ddp' (choose from "
                                "'torch_ddp', 'deepspeed', 'torch_fsdp') (see --help)"),
    (["--overrides", "train_conf.fsdp_sharding_strategy zero3"],  # issue 48
     "train_conf.fsdp_sharding_strategy is a --train_engine torch_fsdp option (got --train_engine torch_ddp)"),
    (["--checkpoint", "exp/epoch_9.pt"], "--checkpoint exp/epoch_9.pt: no such file"),
    pytest.param(["--overrides", "train_conf.dtype fp16"], "train_conf.dtype fp16 needs a GPU; use bf16 or fp32 on CPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is valid with a GPU")),
    # issue 46: the streaming options and keys (found by the new-user trial: refused only after stages -1..5)
    (["--decoding_chunk_sizes", "16 abc"], "--decoding_chunk_sizes must be auto or encoder frames per chunk (> 0, or "
                                           "-1 for full context), got '16 abc'"),
    (["--num_decoding_left_chunks", "-5"], "--num_decoding_left_chunks must be -1 (all) or >= 0, got '-5'"),
    (["--overrides", "encoder_conf {causal: 'yes'}"], "causal must be true or false, got 'yes'"),
    (["--overrides", "encoder_conf {static_chunk_size: 8, use_dynamic_chunk: true}"],
     "use_dynamic_chunk and static_chunk_size 8: choose one"),
    (["--num_nodes", "2", "--HOST_NODE_ADDR", "nosuchhost.invalid:29400"],
     "--HOST_NODE_ADDR nosuchhost.invalid:29400: the host 'nosuchhost.invalid' does not resolve on"),
])
def test_bad_options_stop_before_any_stage(tmp_path, options, message):
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "run.sh"), "--corpus_dir", str(tmp_path / "nope"),
                           "--data", str(tmp_path / "data"), "--dir", str(tmp_path / "exp"), *options],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr
    assert not re.search(r"^stage -?\d", proc.stdout, re.M) and not (tmp_path / "exp").exists()
    assert "Traceback" not in proc.stderr


def test_decoding_without_the_spelling_lm_of_stage_2_stops_before_any_stage(tmp_path):
    (tmp_path / "data/lm").mkdir(parents=True)
    (tmp_path / "data/lm/lm_3gram.arpa").write_text("an LM from before the spelling LM\n")
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "run.sh"), "--stage", "5", "--data", str(tmp_path / "data"),
                           "--dir", str(tmp_path / "exp")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and not re.search(r"^stage -?\d", proc.stdout, re.M), proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith("spelling_6gram_30000common.arpa is missing: run stage 2 (--stage 2 "
                                        "--stop_stage 2), or decode without it (--spelling_order 0)"), proc.stderr


def test_a_dir_holding_an_earlier_run_stops_before_any_stage_unless_told_to_continue_or_start_over(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "train.yaml").write_text("encoder: conformer\n")  # an earlier run, killed before its first checkpoint

    def run_sh(*options):
        return subprocess.run(["bash", os.path.join(REPO_ROOT, "run.sh"), "--corpus_dir", str(tmp_path / "nope"),
                               "--data", str(tmp_path / "data"), "--dir", str(exp), *options],
                              capture_output=True, text=True, timeout=120)

    proc = run_sh()
    assert proc.returncode == 1 and not re.search(r"^stage -?\d", proc.stdout, re.M), proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"--model_dir {exp} holds an earlier run (train.yaml): continue it with --checkpoint auto, start a new one "
        f"there with --start_over (run.sh: --start_over true), which moves the old one into "
        f"{exp}/previous_runs/, or train into another "
        "--model_dir (run.sh: --dir)")
    for told in (["--start_over", "true"], ["--checkpoint", "auto"], ["--max_restarts", "2"]):
        proc = run_sh("--stage", "4", *told)  # the option reaches the check: the next stop is the missing data
        assert proc.returncode == 1 and "global_cmvn is missing: training needs it" in proc.stderr, proc.stderr
    assert run_sh("--stage", "5").returncode == 1  # no stage 4 in the range: the dir is not checked
    assert "option --start_over takes true or false, got 'yes'" in run_sh("--start_over", "yes").stderr
    assert os.listdir(exp) == ["train.yaml"]


def test_a_checkpoint_of_another_config_stops_before_any_stage(tmp_path):
    # the model dir's newest epoch is train_tiny.yaml's model; the recipe's default config builds another one
    _, init = write_model(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    (data / "dict").mkdir(parents=True)
    (data / "train").mkdir()
    shutil.copy(tmp_path / "units.txt", data / "dict" / "units.txt")
    shutil.copy(tmp_path / "cmvn", data / "train" / "global_cmvn")
    exp.mkdir()
    save_checkpoint(str(exp / "epoch_0.pt"), load_checkpoint(init), {"epoch": 0, "step": 5, "cv_loss": 9.0})

    def run_sh(*options):
        return subprocess.run(["bash", os.path.join(REPO_ROOT, "run.sh"), "--stage", "4", "--data", str(data),
                               "--dir", str(exp), "--checkpoint", "auto", *options],
                              capture_output=True, text=True, timeout=120)

    proc = run_sh()
    assert proc.returncode == 1 and not re.search(r"^stage -?\d", proc.stdout, re.M), proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"{exp}/epoch_0.pt holds another model than this config's: ") and "\n" not in line
    assert line.endswith("; use the config it was trained with (the train.yaml beside it)")
    proc = run_sh("--train_config", "conf/train_tiny.yaml", "--average_num", "0")  # its own config: the next stop
    assert proc.returncode == 1 and "data/train/data.list is missing: training needs it" in proc.stderr, proc.stderr
