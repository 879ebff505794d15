"""Shards over 2 real gloo ranks x 2 loader workers: every utterance exactly once per epoch, reshuffled per epoch."""

import json
import os
from pathlib import Path

from toolkit.dataset.shard import write_shard
from toolkit.text.tokenizer import write_symbol_table

from .launch import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_shard_partition.py")
FSDD = Path(__file__).resolve().parents[2] / "corpora/tiny_fsdd"


def fsdd_entries(split):
    with open(FSDD / "data" / split / "text", encoding="utf-8") as f:
        texts = dict(line.rstrip("\n").split(" ", 1) for line in f)
    with open(FSDD / "data" / split / "wav.scp", encoding="utf-8") as f:
        return [{"key": k, "wav": str(FSDD / w), "txt": texts[k]} for k, w in (l.split() for l in f)]


def test_odd_shard_count_two_ranks_two_workers_each_key_once(tmp_path):
    entries = fsdd_entries("train")[:27]
    paths = []
    for i in range(9):  # 9 shards over 4 global workers: rank 0 reads 5 shards, rank 1 reads 4
        paths.append(str(tmp_path / f"shard_{i}.tar"))
        assert write_shard(entries[3 * i:3 * i + 3], paths[-1]) == (3, [])
    (tmp_path / "data.list").write_text("".join(p + "\n" for p in paths))
    write_symbol_table(sorted(set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")) + ["▁"], str(tmp_path / "units.txt"))
    proc = run_ranks(WORKER, str(tmp_path / "data.list"), str(tmp_path / "units.txt"), str(tmp_path / "out.json"),
                     timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "9 shards do not divide evenly over 2 ranks x 2 workers; shards per rank: [5, 4]" in proc.stderr
    epochs = json.loads((tmp_path / "out.json").read_text())
    expected = sorted(e["key"] for e in entries)
    for ranks in epochs:
        assert sorted(ranks[0]["keys"] + ranks[1]["keys"]) == expected
        assert sorted(len(r["keys"]) for r in ranks) == [12, 15]  # whole shards: 4 x 3 and 5 x 3
        assert all(r["skipped"] == {} for r in ranks)
    assert epochs[0][0]["keys"] != epochs[1][0]["keys"]
    assert set(epochs[0][0]["keys"]) != set(epochs[1][0]["keys"])  # the epoch permutation moves shards across ranks
