import io
import json
import logging
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from toolkit.dataset import processor
from toolkit.dataset import build_dataloader, build_dataset, count_utterances
from toolkit.dataset.shard import read_shards, write_shard
from toolkit.utils.config_parsing import ConfigError
from toolkit.text.tokenizer import CharTokenizer, write_symbol_table

from test.helpers import REPO_ROOT, kaldi_entries

KATHLEEN = REPO_ROOT / "corpora/kathleen"
SO762 = REPO_ROOT / "corpora/speechocean762"
FSDD = REPO_ROOT / "corpora/tiny_fsdd"


@pytest.fixture(scope="module")
def entries():
    return kaldi_entries(KATHLEEN, "dev")[:6] + kaldi_entries(SO762, "dev")[:5]  # Ogg Opus, 16 kHz


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, entries):
    path = tmp_path_factory.mktemp("dict") / "units.txt"
    write_symbol_table(sorted(set("ABCDEFGHIJKLMNOPQRSTUVWXYZ'")) + ["▁"], str(path))
    return CharTokenizer(str(path))


def read_all(paths):
    counts = Counter()
    return list(read_shards(paths, counts)), counts


def test_shard_round_trip_keeps_audio_bytes_and_transcripts(tmp_path, entries):
    path = str(tmp_path / "a.tar")
    assert write_shard(entries, path) == (len(entries), [])
    assert not (tmp_path / "a.tar.tmp").exists()
    with tarfile.open(path) as tar:
        names = tar.getnames()
    assert names[:2] == [f"{entries[0]['key']}.txt", f"{entries[0]['key']}.opus"]
    samples, counts = read_all([path])
    assert not counts
    assert [s["key"] for s in samples] == [e["key"] for e in entries]
    for sample, entry in zip(samples, entries):
        assert sample["txt"] == entry["txt"]
        assert sample["wav_bytes"] == Path(entry["wav"]).read_bytes()
        from_shard = processor.read_audio(sample)
        from_file = processor.read_audio(entry)
        assert "wav_bytes" not in from_shard and from_shard["sample_rate"] == 16000
        np.testing.assert_array_equal(from_shard["waveform"], from_file["waveform"])
    write_shard(entries, str(tmp_path / "b.tar"))
    assert (tmp_path / "b.tar").read_bytes() == Path(path).read_bytes()  # deterministic


def test_segment_is_cut_and_stored_as_flac(tmp_path, entries):
    segment = dict(entries[0], start=0.5, end=1.25)
    whole = processor.read_audio(entries[0])["waveform"]
    direct = processor.read_audio(segment)["waveform"]
    np.testing.assert_array_equal(direct, whole[8000:20000])
    write_shard([segment], str(tmp_path / "seg.tar"))
    (sample,), _ = read_all([str(tmp_path / "seg.tar")])
    assert sample["wav"].endswith(".flac")
    from_shard = processor.read_audio(sample)["waveform"]
    assert from_shard.shape == (12000,)
    assert np.abs(from_shard - direct).max() <= 1 / 32768 + 1e-7  # 16-bit FLAC


def corrupt(path, damage):
    """Per ``(member_name, where)``: overwrite the member's header checksum field ("header") or the first 64
    bytes of its data ("data"). Offsets are read before any damage (tarfile stops at a bad header)."""
    with tarfile.open(path) as tar:
        infos = {name: tar.getmember(name) for name, _ in damage}
    with open(path, "r+b") as f:
        for name, where in damage:
            f.seek(infos[name].offset + 148 if where == "header" else infos[name].offset_data)
            f.write(b"\x07" * (8 if where == "header" else 64))


def test_corrupt_members_are_skipped_and_the_rest_is_read(tmp_path, entries, caplog):
    path = str(tmp_path / "c.tar")
    write_shard(entries, path)
    corrupt(path, [(f"{entries[1]['key']}.opus", "header"), (f"{entries[3]['key']}.txt", "header"),
                   (f"{entries[5]['key']}.opus", "data")])
    with caplog.at_level(logging.WARNING):
        samples, counts = read_all([path])
    assert counts == {"corrupt_member": 2}
    assert [s["key"] for s in samples] == [e["key"] for i, e in enumerate(entries) if i not in (1, 3)]
    assert entries[1]["key"] in caplog.text and entries[3]["key"] in caplog.text
    decode_counts = Counter()
    decoded = list(processor.map_skipping(samples, processor.read_audio, decode_counts))
    assert decode_counts == {"unreadable_audio": 1} and len(decoded) == len(entries) - 3


def test_truncated_and_missing_shards(tmp_path, entries):
    path = tmp_path / "t.tar"
    write_shard(entries, str(path))
    with tarfile.open(path) as tar:
        cut = tar.getmember(f"{entries[4]['key']}.opus").offset_data + 100
    path.write_bytes(path.read_bytes()[:cut])
    samples, counts = read_all([str(path), str(tmp_path / "none.tar")])  # bare paths: counts unknown
    assert [s["key"] for s in samples] == [e["key"] for e in entries[:4]]
    assert counts == {"corrupt_shard": 1, "missing_shard": 1}
    samples, counts = read_all([shard_line(path, len(entries)), shard_line(tmp_path / "none.tar", 6)])
    assert [s["key"] for s in samples] == [e["key"] for e in entries[:4]]
    assert counts == {"corrupt_shard": len(entries) - 4, "missing_shard": 6}


def shard_line(path, num_utts=None):
    """A shard data.list line: as make_shard_list.py writes it, or (num_utts None) a bare path of an older list."""
    return str(path) if num_utts is None else json.dumps({"shard": str(path), "num_utts": num_utts})


@pytest.fixture(scope="module")
def fsdd3():
    return kaldi_entries(FSDD, "dev")[:3]  # 16-bit WAV, stored as they are


def cut_shard(path, entries, where):
    """Write ``entries`` as a shard, then cut it where an interrupted copy may stop, around the second utterance."""
    write_shard(entries, str(path))
    with tarfile.open(path) as tar:
        txt, audio = (tar.getmember(f"{entries[1]['key']}.{ext}") for ext in ("txt", "wav"))
    cut = {"at_a_header_boundary": txt.offset, "inside_a_txt_header": txt.offset + 100,
           "inside_an_audio_header": audio.offset + 300, "inside_audio_data": audio.offset_data + 100}[where]
    path.write_bytes(path.read_bytes()[:cut])


# (skip counts with a bare path, with the count 3 recorded): the second utterance's transcript was read whole only
# when the cut is inside its audio header (then it is a corrupt_member); every other loss is the corrupt_shard rest.
CUTS = {"at_a_header_boundary": ({"corrupt_shard": 1}, {"corrupt_shard": 2}),
        "inside_a_txt_header": ({"corrupt_shard": 1}, {"corrupt_shard": 2}),
        "inside_an_audio_header": ({"corrupt_member": 1, "corrupt_shard": 1},
                                   {"corrupt_member": 1, "corrupt_shard": 1}),
        "inside_audio_data": ({"corrupt_shard": 1}, {"corrupt_shard": 2})}


@pytest.mark.parametrize("where", sorted(CUTS))
def test_a_cut_shard_names_itself_and_counts_its_lost_utterances(tmp_path, fsdd3, where, caplog):
    path = tmp_path / "trunc.tar"
    cut_shard(path, fsdd3, where)
    for num_utts, expected in zip((None, 3), CUTS[where]):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            samples, counts = read_all([shard_line(path, num_utts)])
        assert [s["key"] for s in samples] == [fsdd3[0]["key"]]
        assert counts == expected
        assert f"shard {path}: corrupt_shard" in caplog.text
    assert len(samples) + sum(counts.values()) == 3  # with the count recorded, every utterance is accounted for


@pytest.mark.parametrize("num_utts, expected", [(None, {"corrupt_shard": 1}), (3, {"corrupt_shard": 2})])
def test_shard_cut_at_a_header_through_build_dataset(tmp_path, fsdd3, tokenizer, caplog, num_utts, expected):
    """The shard-cut-at-header case: the first utterance is trained, the lost rest is named and counted."""
    cut_shard(tmp_path / "trunc.tar", fsdd3, "at_a_header_boundary")
    (tmp_path / "shard.list").write_text(shard_line(tmp_path / "trunc.tar", num_utts) + "\n")
    conf = {"data_type": "shard", "dataloader_conf": {"num_workers": 0}}
    keys, skipped = [], Counter()
    with caplog.at_level(logging.WARNING):
        for batch in build_dataset(str(tmp_path / "shard.list"), tokenizer, conf, mode="cv"):
            keys += batch["keys"]
            skipped.update(batch["num_skipped"])
    assert keys == [fsdd3[0]["key"]] and skipped == expected
    assert "trunc.tar: corrupt_shard" in caplog.text
    assert ("bare paths with no utterance count" in caplog.text) == (num_utts is None)


def test_lost_shards_count_the_utterances_their_lines_record(tmp_path, fsdd3, caplog):
    write_shard(fsdd3, str(tmp_path / "a.tar"))
    samples, counts = read_all([shard_line(tmp_path / "gone.tar", 7), shard_line(tmp_path / "a.tar", 3)])
    assert len(samples) == 3 and counts == {"missing_shard": 7}
    # A line recording more than the shard holds (a stale list) counts the shortfall; fewer is only a warning.
    samples, counts = read_all([shard_line(tmp_path / "a.tar", 5)])
    assert len(samples) == 3 and counts == {"corrupt_shard": 2}
    with caplog.at_level(logging.WARNING):
        samples, counts = read_all([shard_line(tmp_path / "a.tar", 2)])
    assert len(samples) == 3 and not counts and "more than the 2 its data.list line records" in caplog.text


def test_shard_list_lines_are_checked_and_counted(tmp_path, fsdd3, tokenizer):
    write_shard(fsdd3, str(tmp_path / "a.tar"))
    lines = [shard_line(tmp_path / "a.tar", 3), shard_line(tmp_path / "gone.tar", 4), shard_line(tmp_path / "a.tar")]
    (tmp_path / "data.list").write_text("\n".join(lines) + "\n")
    conf = {"data_type": "shard"}
    assert count_utterances(str(tmp_path / "data.list"), "shard") == 3 + 4 + 3  # recorded, recorded, header scan
    for bad in ['{"shard": "a.tar"}', '{"shard": "a.tar", "num_utts": -1}', '{"shard": "a.tar", "num_utts": 2',
                '{"path": "a.tar", "num_utts": 2}']:
        (tmp_path / "data.list").write_text(lines[0] + "\n" + bad + "\n")
        with pytest.raises(ConfigError, match=r"data.list:2: not a shard data.list line.*make_shard_list"):
            build_dataset(str(tmp_path / "data.list"), tokenizer, conf)


def test_write_shard_leaves_out_unreadable_sources(tmp_path, entries):
    bad = {"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "A"}
    num, skipped = write_shard([entries[0], bad], str(tmp_path / "s.tar"))
    assert (num, skipped) == (1, [("gone", "missing_audio")])


def test_raw_and_shard_give_identical_utterances_with_dynamic_batches(tmp_path, entries, tokenizer):
    bad = [{"key": "bad-missing", "wav": str(tmp_path / "nope.wav"), "txt": "A"},
           dict(entries[0], key="bad-empty-text", txt=" "), dict(entries[1], key="bad-unk", txt="ÄÖ")]
    all_entries = entries + bad[1:]  # a missing file cannot be put in a shard; the rest are bad later
    raw_list = tmp_path / "raw.list"
    raw_list.write_text("".join(json.dumps(e) + "\n" for e in all_entries))
    shard_paths = [str(tmp_path / f"s{i}.tar") for i in range(3)]
    for i, path in enumerate(shard_paths):
        write_shard(all_entries[i::3], path)
    shard_list = tmp_path / "shard.list"
    shard_list.write_text("".join(p + "\n" for p in shard_paths))
    results = {}
    for data_type, data_list in (("raw", raw_list), ("shard", shard_list)):
        conf = {"data_type": data_type, "batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 1500},
                "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}}
        keys, skipped, frames = [], Counter(), 0
        for batch in build_dataloader(build_dataset(str(data_list), tokenizer, conf)):
            keys += batch["keys"]
            skipped.update(batch["num_skipped"])
            frames += int(batch["feats_lengths"].sum())
            assert batch["feats"].shape[0] * batch["feats"].shape[1] <= 1500 or len(batch["keys"]) == 1
        results[data_type] = (sorted(keys), skipped, frames)
    assert results["raw"] == results["shard"]
    assert results["raw"][0] == sorted(e["key"] for e in entries)
    assert results["raw"][1] == {"empty_text": 1, "all_unknown": 1}


def test_bucket_batching_through_the_shard_pipeline(tmp_path, entries, tokenizer):
    write_shard(entries, str(tmp_path / "s.tar"))
    (tmp_path / "shard.list").write_text(str(tmp_path / "s.tar") + "\n")
    conf = {"data_type": "shard", "dataloader_conf": {"num_workers": 0},
            "batch_conf": {"batch_type": "bucket", "bucket_boundaries": [300], "bucket_batch_sizes": [3, 2]}}
    batches = list(build_dataloader(build_dataset(str(tmp_path / "shard.list"), tokenizer, conf)))
    assert sorted(k for b in batches for k in b["keys"]) == sorted(e["key"] for e in entries)
    for b in batches:
        short = bool(b["feats_lengths"].max() < 300)
        assert (b["feats_lengths"] < 300).all() == short  # one bucket per batch
        assert len(b["keys"]) <= (3 if short else 2)


def test_read_audio_from_corrupt_bytes_is_unreadable():
    sample = {"key": "k", "wav": "x.tar:k.wav", "wav_bytes": io.BytesIO(b"RIFF junk" * 9).getvalue(), "txt": "A"}
    with pytest.raises(processor.SkipSample, match="unreadable_audio"):
        processor.read_audio(sample)
    with pytest.raises(processor.SkipSample, match="empty_audio"):
        buffer = io.BytesIO()
        sf.write(buffer, np.zeros(0, dtype=np.float32), 16000, format="WAV")
        processor.read_audio(dict(sample, wav_bytes=buffer.getvalue()))
