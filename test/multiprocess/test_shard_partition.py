"""Shards over 2 real gloo ranks x 2 loader workers: every utterance exactly once per epoch, reshuffled per epoch."""

import json

from toolkit.dataset.shard import write_shard
from toolkit.text.tokenizer import write_symbol_table

from test.helpers import kaldi_entries

from .workers.launch import WORKERS, run_ranks

WORKER = str(WORKERS / "worker_shard_partition.py")


def test_odd_shard_count_two_ranks_two_workers_each_key_once(tmp_path):
    entries = kaldi_entries("tiny_fsdd", "train")[:27]
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
