"""Inputs and runs for the decoding tests: a tiny conformer (train_tiny.yaml) with seeded random weights and the
tiny_fsdd char dictionary, test data.lists of real tiny_fsdd speech (unseen speaker), and
``toolkit.bin.recognize`` run alone (plain python: one rank) or under torchrun with a hard timeout."""

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import subprocess
import sys

import torch

from toolkit.dataset.cmvn_stats import compute_stats
from toolkit.models.registry import init_model
from toolkit.models.transformer.asr_model import DECODING_METHODS
from toolkit.text.tokenizer import WORD_BOUNDARY, init_tokenizer, text_to_char_units, write_symbol_table
from toolkit.train_config import read_config
from toolkit.utils.checkpoint import save_checkpoint

from test.helpers import REPO_ROOT, kaldi_entries

from .recipe_data import CONF, ENV

MODES = DECODING_METHODS
TIMEOUT_S = 240  # one decoding job: ~15 s on 2 idle cores; a hang still fails here


def load_tool(name: str):
    """The script ``tools/<name>.py`` as a module (its functions, and ``main`` taking an argv list)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_model(data_dir, *overrides: str) -> tuple[str, str]:
    """``data_dir/model/train.yaml`` and ``init.pt``: train_tiny.yaml's model (with config ``overrides``), the char
    units and the CMVN of the tiny_fsdd train set (by the recipe's tools' functions), weights drawn from seed 0
    (decoding is deterministic; the outputs are nonsense, but vary with the audio, which is all an identity test
    needs)."""
    train = kaldi_entries("tiny_fsdd", "train")
    write_symbol_table(sorted({u for e in train for u in text_to_char_units(e["txt"])} | {WORD_BOUNDARY}),
                       str(data_dir / "units.txt"))
    fbank = {"num_mel_bins": 80, "frame_length": 25.0, "frame_shift": 10.0}
    stats, skipped = compute_stats(train, fbank, 16000, num_workers=1)
    assert not skipped
    with open(data_dir / "cmvn", "w", encoding="utf-8") as f:
        json.dump(stats, f)
    config = read_config(CONF, [f"tokenizer_conf.symbol_table_path {data_dir / 'units.txt'}",
                                f"cmvn_conf.cmvn_file {data_dir / 'cmvn'}", *overrides])
    vocab_size = init_tokenizer(config.tokenizer, config.tokenizer_conf).vocab_size()
    config = dataclasses.replace(config, output_dim=vocab_size)
    os.makedirs(data_dir / "model", exist_ok=True)
    config.save(str(data_dir / "model" / "train.yaml"))
    torch.manual_seed(0)
    model = init_model(config)
    save_checkpoint(str(data_dir / "model" / "init.pt"), {"model": model.state_dict()}, {"epoch": -1})
    return str(data_dir / "model" / "train.yaml"), str(data_dir / "model" / "init.pt")


def fsdd_test_entries() -> list[dict]:
    """The 20 tiny_fsdd test utterances (unseen speaker), ``{"key", "wav", "txt"}`` in key order."""
    return kaldi_entries("tiny_fsdd", "test")


def write_list(path, entries: list[dict]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return str(path)


def write_text(path, entries: list[dict]) -> str:
    """The Kaldi ``text`` of ``entries`` (the reference file ``tools/compute_wer.py`` takes)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{e['key']} {e['txt']}\n" for e in entries)
    return str(path)


def run_recognize(nproc: int, model: tuple[str, str], test_list: str, result_dir, *extra: str,
                  worker: str | None = None, modes=MODES) -> subprocess.CompletedProcess:
    """Decode ``test_list`` with ``nproc`` ranks (1: plain ``python``, no launcher) and batch size 1 unless
    ``extra`` says otherwise; ``worker`` replaces ``-m toolkit.bin.recognize`` by a script taking the same
    arguments."""
    config, checkpoint = model
    args = ["--config", config, "--checkpoint", checkpoint, "--test_data", test_list, "--result_dir",
            str(result_dir), "--modes", *modes, "--beam_size", "4", "--batch_size", "1", *extra]
    program = [worker] if worker else ["-m", "toolkit.bin.recognize"]
    launcher = [sys.executable] if nproc == 1 and not worker else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(launcher + program + args, capture_output=True, text=True, timeout=TIMEOUT_S, env=ENV,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def read_outputs(result_dir, modes=MODES) -> dict:
    """What must not depend on the number of ranks: every mode's ``text``, ``wer`` and ``cer`` bytes, and the
    summary without its per-rank and timing fields."""
    outputs = {}
    for mode in modes:
        for name in ("text", "wer", "cer"):
            with open(os.path.join(result_dir, mode, name), "rb") as f:
                outputs[f"{mode}/{name}"] = f.read()
    with open(os.path.join(result_dir, "decode_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    for varying in ("world_size", "decoded_per_rank", "decode_wall_s", "rtf", "progress_store_adds"):
        summary.pop(varying)
    outputs["summary"] = summary
    return outputs


def assert_same_decoding(a: dict, b: dict) -> None:
    """``read_outputs`` of two runs are equal, and each decoded every listed utterance exactly once."""
    for outputs in (a, b):
        utts = outputs["summary"]["utterances"]
        assert utts["repeated"] == 0 and utts["decoded"] == utts["decoded_keys"], utts
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name


def compute_wer(*args: str) -> str:
    """What ``tools/compute_wer.py ARGS`` prints (its ``main``, run in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        load_tool("compute_wer").main(list(args))
    return out.getvalue()
