import json
import os
import re
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from toolkit.dataset.processor import read_audio
from toolkit.dataset.data_list import read_raw_list
from toolkit.dataset.shard import make_shards, read_shards, write_shard_list

from test.helpers import REPO_ROOT


FSDD = REPO_ROOT / "corpora/tiny_fsdd"
KATHLEEN = REPO_ROOT / "corpora/kathleen"


def entries_of(corpus, split, n):
    with open(corpus / "data" / split / "text", encoding="utf-8") as f:
        texts = dict(line.rstrip("\n").split(" ", 1) for line in f)
    with open(corpus / "data" / split / "wav.scp", encoding="utf-8") as f:
        pairs = [line.split() for line in f][:n]
    return [{"key": k, "wav": str(corpus / w), "txt": texts[k]} for k, w in pairs]


def make_shard_list_cli(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/make_shard_list.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def run_tool(*args):
    proc = make_shard_list_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_parallel_shards_then_resume_writes_only_the_missing_one(tmp_path):
    entries = entries_of(FSDD, "dev", 7) + [{"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "ONE"}]
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(e) + "\n" for e in entries))
    shard_dir, shard_list = tmp_path / "shards", tmp_path / "data.list"
    proc = run_tool("--num_utts_per_shard", 3, "--num_workers", 2, raw, shard_dir, shard_list)
    assert ("3 shards (0 already there), 7 utterances written, 1 left out in this run; "
            "the list holds 7 of the 8 entries") in proc.stdout
    assert "left out gone: missing_audio" in proc.stderr
    lines = shard_list.read_text().splitlines()
    paths = [json.loads(line)["shard"] for line in lines]
    assert paths == [str(shard_dir / f"shards_{i:06d}.tar") for i in range(3)]
    assert [json.loads(line)["num_utts"] for line in lines] == [3, 3, 1]  # the last shard lost "gone"
    counts = Counter()
    assert [s["key"] for s in read_shards(lines, counts)] == [e["key"] for e in entries[:7]] and not counts
    with tarfile.open(paths[2]) as tar:
        assert len(tar.getnames()) == 2 * 1  # entries 7 and 8: one written, one left out

    before = {p: (os.stat(p).st_mtime_ns, Path(p).read_bytes()) for p in paths}
    os.remove(paths[1])
    Path(paths[1] + ".tmp").write_bytes(b"half-written shard of a killed run")
    entries = read_raw_list(str(raw))  # the same run, in-process (a second CLI start costs 10 s)
    assert make_shards(entries, str(shard_dir), 3, 2)[:3] == (paths, 2, 3)
    for p in (paths[0], paths[2]):
        assert os.stat(p).st_mtime_ns == before[p][0]  # not rewritten
    assert Path(paths[1]).read_bytes() == before[paths[1]][1]
    assert not Path(paths[1] + ".tmp").exists()

    # Other input into the same folder: the old shards go, none is reused.
    assert make_shards(entries[:4], str(shard_dir), 3, 1)[1:3] == (0, 4)
    assert sorted(os.listdir(shard_dir)) == ["shards.fingerprint", "shards_000000.tar", "shards_000001.tar"]


def test_flac_shards_decode_to_the_source_audio(tmp_path):
    entries = entries_of(KATHLEEN, "dev", 2)
    paths, reused, written, skipped = make_shards(entries, str(tmp_path), 5, 1, audio_format="flac")
    assert (len(paths), reused, written, skipped) == (1, 0, 2, [])
    samples = list(read_shards(paths, Counter()))
    assert [s["wav"].rsplit(".", 1)[1] for s in samples] == ["flac", "flac"]
    for sample, entry in zip(samples, entries):
        ours, source = read_audio(sample)["waveform"], read_audio(entry)["waveform"]
        assert ours.shape == source.shape
        assert np.abs(ours - source).max() <= 1 / 32768 + 1e-6  # 16-bit quantisation only


def test_bad_raw_line_names_the_line(tmp_path):
    raw = tmp_path / "raw.list"
    raw.write_text('{"key": "a", "wav": "a.wav", "txt": "A"}\n{"key": "b"}\n')
    with pytest.raises(ValueError, match=r"raw.list:2"):
        read_raw_list(str(raw))
    with pytest.raises(ValueError, match="num_utts_per_shard"):
        make_shards([], str(tmp_path), 0, 1)


def test_shard_list_records_counts_and_refuses_a_damaged_shard(tmp_path):
    entries = entries_of(FSDD, "dev", 5)
    paths, _, _, _ = make_shards(entries, str(tmp_path / "shards"), 2, 1)
    data_list = tmp_path / "data.list"
    assert write_shard_list(paths, str(data_list)) == 5
    assert [json.loads(line) for line in data_list.read_text().splitlines()] == [
        {"shard": p, "num_utts": n} for p, n in zip(paths, [2, 2, 1])]
    # A shard cut after a member (what a full disk or a killed copy leaves) is named, not listed with a wrong count.
    with tarfile.open(paths[1]) as tar:
        cut = tar.getmember(f"{entries[3]['key']}.txt").offset
    Path(paths[1]).write_bytes(Path(paths[1]).read_bytes()[:cut])
    with pytest.raises(ValueError, match="shards_000001.tar is missing or incomplete"):
        write_shard_list(paths, str(data_list))
    raw = tmp_path / "raw.list"
    raw.write_text("".join(json.dumps(e) + "\n" for e in entries))
    # The same input, so the damaged shard would be reused: the CLI names it in one line.
    proc = make_shard_list_cli("--num_utts_per_shard", "2", raw, tmp_path / "shards", data_list)
    assert proc.returncode == 1 and re.search("shards_000001.tar is missing or incomplete.*delete it", proc.stderr)
    assert "Traceback" not in proc.stderr
