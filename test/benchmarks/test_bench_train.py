"""benchmarks/bench_train.py on the shipped speech: it trains through the real trainer and counts what was trained;
the side-by-side config has WeNet's parameter count."""

import json
import subprocess
import sys

import pytest

from harness import PARTS

from toolkit.dataset import build_dataloader, build_dataset
from toolkit.models.registry import init_model
from toolkit.text.tokenizer import CharTokenizer
from toolkit.text.units import collect_char_units
from toolkit.train_config import read_config

from test.helpers import REPO_ROOT

CORPORA = ["speechocean762", "kathleen", "ljspeech", "fsdd"]
# WeNet's count for ../shared/bench/wenet_conformer_6x256.yaml with the char table of the four training sets
# (../shared/docs/machine-facts.md).
WENET_PARAMETERS = 14_532_670


def test_conformer_6x256_has_wenets_parameter_count(tmp_path):
    text = tmp_path / "text"
    text.write_text("".join((REPO_ROOT / "corpora" / c / "data" / "train" / "text").read_text(encoding="utf-8")
                            for c in CORPORA), encoding="utf-8")
    vocab_size = len(collect_char_units(str(text))) + 3  # <blank>, <unk>, <sos/eos>
    config = read_config(str(REPO_ROOT / "benchmarks" / "conf" / "conformer_6x256.yaml"), ["cmvn null"])
    model = init_model(config, vocab_size=vocab_size)
    assert sum(p.numel() for p in model.parameters()) == WENET_PARAMETERS


@pytest.mark.multiprocess  # a training run in a process of its own
def test_bench_train_counts_every_trained_frame(tmp_path):
    # tiny_fsdd, 64 utterances, batch 32: a whole epoch of 2 steps in 1 process.
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_train.py"),
                           "--config", str(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"),
                           "--corpus_dir", str(REPO_ROOT / "corpora"), "--corpora", "tiny_fsdd", "--num_utts", "64",
                           "--cv_utts", "4", "--steps", "0", "--warmup", "1", "--nproc", "1",
                           "--work_dir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "input frames/s" in proc.stdout
    run = next(iter(json.loads(out.read_text())["runs"].values()))
    steps = run["ranks"][0]["steps"]
    # What the pipeline makes of the same list without augmentation (none of it changes lengths here).
    data = tmp_path / "work" / "data"
    conf = read_config(str(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"),
                       ["dataset_conf.dataloader_conf.num_workers 0"]).dataset_conf
    batches = list(build_dataloader(build_dataset(str(data / "train.list"), CharTokenizer(str(data / "units.txt")),
                                                  conf, mode="cv")))
    assert [s["utts"] for s in steps] == [32, 32]
    assert sum(s["frames"] for s in steps) == sum(int(b["feats_lengths"].sum()) for b in batches)
    for step in steps:
        assert abs(sum(step[p] for p in PARTS) + step["other"] - step["wall"]) < 1e-9
        assert step["forward"] > 0 and step["backward"] > 0 and step["optimizer"] > 0
    steady = steps[1]
    assert abs(run["frames_per_s"] - steady["frames"] / steady["wall"]) < 1e-6 * run["frames_per_s"]
    assert run["peak_rss_mib"][0] > 100 and run["flops_per_frame"] > 0 and 0 < run["ceiling_fraction"] < 1
