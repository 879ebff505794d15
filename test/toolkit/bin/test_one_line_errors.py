"""A foreseeable user error reaches the user as one line and exit status 2, not as a library traceback (the
errors-as-tracebacks case): a checkpoint of another config, at decoding and at a resume; an unknown option value."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from toolkit.models.registry import init_model
from toolkit.text.tokenizer import write_symbol_table
from toolkit.utils.checkpoint import save_checkpoint

from test.helpers import REPO_ROOT, kaldi_entries

CONF = os.path.join(REPO_ROOT, "examples", "english", "s0", "conf", "train_tiny.yaml")
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def assert_one_line(proc, *expected):
    """Exit 2, no traceback, and exactly one error line, holding every ``expected`` text."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and all(text in errors[0] for text in expected), proc.stderr[-3000:]


@pytest.fixture
def checkpoint_of_a_96_wide_model(tmp_path):
    """``exp/epoch_0.pt`` of train_tiny.yaml (96 wide, 2 blocks), untrained, with its train.yaml and lists."""
    units = sorted(set("".join(row["txt"] for row in kaldi_entries("tiny_fsdd", "train"))))
    write_symbol_table(units, str(tmp_path / "units.txt"))
    conf = yaml.safe_load(open(CONF))
    conf.update(cmvn=None, output_dim=len(units) + 3, input_dim=80)
    conf["tokenizer_conf"]["symbol_table_path"] = str(tmp_path / "units.txt")
    (tmp_path / "exp").mkdir()
    save_checkpoint(str(tmp_path / "exp" / "epoch_0.pt"), {"model": init_model(conf).state_dict()},
                    {"epoch": 0, "step": 2, "cv_loss": 10.0})
    yaml.safe_dump(conf, open(tmp_path / "exp" / "train.yaml", "w"))
    rows = kaldi_entries("tiny_fsdd", "test")[:2]
    (tmp_path / "test.list").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path, conf


@pytest.mark.parametrize("change, key, shapes", [
    ({"output_size": 64}, "encoder.embed.out.weight is (96, 608) in the checkpoint, (64, 608) in this config's model",
     ("keys differ)",)),
    ({"num_blocks": 1}, "the checkpoint's encoder.encoders.1.", ("is not in this config's model",))])
def test_recognize_refuses_a_checkpoint_of_another_config_in_one_line(checkpoint_of_a_96_wide_model, change, key,
                                                                       shapes):
    tmp_path, conf = checkpoint_of_a_96_wide_model
    conf["encoder_conf"].update(change)
    yaml.safe_dump(conf, open(tmp_path / "other.yaml", "w"))
    proc = run("-m", "toolkit.bin.recognize", "--config", str(tmp_path / "other.yaml"), "--checkpoint",
               str(tmp_path / "exp" / "epoch_0.pt"), "--test_data", str(tmp_path / "test.list"), "--result_dir",
               str(tmp_path / "dec"), "--modes", "ctc_greedy_search")
    assert_one_line(proc, f"checkpoint {tmp_path / 'exp' / 'epoch_0.pt'} ({tmp_path / 'other.yaml'}) "
                          "holds another model than this config's: ", key, *shapes)
    assert not (tmp_path / "dec").exists()


@pytest.mark.multiprocess  # a process group, the data loaders and the TorchScript check first: ~60 s on 2 busy cores
def test_train_refuses_resuming_a_checkpoint_of_another_config_in_one_line(checkpoint_of_a_96_wide_model):
    tmp_path, conf = checkpoint_of_a_96_wide_model
    data = tmp_path / "test.list"
    proc = run("-m", "toolkit.bin.train", "--config", str(tmp_path / "exp" / "train.yaml"), "--train_data",
               str(data), "--cv_data", str(data), "--model_dir", str(tmp_path / "exp"), "--tensorboard_dir",
               str(tmp_path / "tb"), "--checkpoint", str(tmp_path / "exp" / "epoch_0.pt"),
               "--override_config", "encoder_conf.output_size 64", "--override_config", "train_conf.max_epoch 2",
               timeout=300)
    assert_one_line(proc, "encoder.embed.out.weight is (96, 608) in the checkpoint, (64, 608) in this config's model")


@pytest.mark.parametrize("option", ["--checkpoint", "--train_data"])
def test_train_refuses_a_missing_input_before_it_starts_a_rank(tmp_path, option):
    # Found by each rank under torchrun's traceback before; now by train.py's first step (and --check_only).
    given = {"--checkpoint": str(tmp_path / "exp" / "epoch_9.pt"), "--train_data": str(tmp_path / "train.list")}
    (tmp_path / "train.list").write_text("")
    given[option] = str(tmp_path / "nope")
    proc = run("-m", "toolkit.bin.train", "--config", CONF, "--train_data", given["--train_data"], "--cv_data",
               str(tmp_path / "train.list"), "--model_dir", str(tmp_path / "exp"), "--checkpoint",
               given["--checkpoint"], "--override_config", "tokenizer_conf.symbol_table_path none.txt")
    assert_one_line(proc, f"{option} {tmp_path / 'nope'}: no such file")
    assert "rank 0/1" not in proc.stderr and not (tmp_path / "exp").exists()  # no process group was started


def _corrupt(path, kind: str) -> str:
    """``path`` (a committed checkpoint) damaged as ``kind`` says; the reason the refusal gives."""
    data = open(path, "rb").read()
    if kind == "truncated":  # a copy cut short (a full disk, an interrupted scp)
        open(path, "wb").write(data[:len(data) // 2])
        return "no zip directory at its end, where torch.save writes one"
    if kind == "random_bytes":
        open(path, "wb").write(torch.randint(0, 256, (len(data),), generator=torch.Generator().manual_seed(0),
                                             dtype=torch.uint8).numpy().tobytes())
        return "no zip directory at its end, where torch.save writes one"
    torch.save([torch.zeros(2)], path)  # a torch save, but not a checkpoint
    return "it holds a list, not a dict"


@pytest.mark.parametrize("kind", ["truncated", "random_bytes", "not_a_dict"])
@pytest.mark.parametrize("command", ["recognize", "average_model", "train"])
def test_a_corrupt_checkpoint_is_one_line_naming_the_file_at_every_entry_point(checkpoint_of_a_96_wide_model, kind,
                                                                                command):
    # The case: a damaged .pt gave a torch traceback (PytorchStreamReader ..., invalid load key, 'list' object is
    # not subscriptable) at decoding, averaging and resume alike.
    tmp_path, _ = checkpoint_of_a_96_wide_model
    exp = tmp_path / "exp"
    (exp / "epoch_1.pt").write_bytes((exp / "epoch_0.pt").read_bytes())
    (exp / "epoch_1.yaml").write_bytes((exp / "epoch_0.yaml").read_bytes())
    reason = _corrupt(exp / "epoch_1.pt", kind)
    data = str(tmp_path / "test.list")
    args = {"recognize": ["-m", "toolkit.bin.recognize", "--config", str(exp / "train.yaml"), "--checkpoint",
                          str(exp / "epoch_1.pt"), "--test_data", data, "--result_dir", str(tmp_path / "dec"),
                          "--modes", "ctc_greedy_search"],
            "average_model": ["-m", "toolkit.bin.average_model", "--src_path", str(exp), "--num", "2",
                              "--dst_model", str(tmp_path / "avg.pt")],
            "train": ["-m", "toolkit.bin.train", "--config", str(exp / "train.yaml"), "--train_data", data,
                      "--cv_data", data, "--model_dir", str(tmp_path / "new_exp"), "--checkpoint",
                      str(exp / "epoch_1.pt")]}[command]
    assert_one_line(run(*args), f"{exp / 'epoch_1.pt'} is not a readable checkpoint (truncated or not a torch "
                                f"save): {reason}")
    assert not any((tmp_path / name).exists() for name in ("dec", "avg.pt", "new_exp"))
