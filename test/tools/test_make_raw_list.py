import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from toolkit.dataset.data_list import reencode_audio

from test.helpers import REPO_ROOT

FSDD = REPO_ROOT / "corpora/tiny_fsdd"
KATHLEEN = REPO_ROOT / "corpora/kathleen"


def make_raw_list_cli(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/make_raw_list.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def data_dir(tmp_path, n):
    """A Kaldi data dir of the first ``n`` tiny_fsdd dev utterances plus one whose audio file is missing."""
    scp = (FSDD / "data/dev/wav.scp").read_text().splitlines()[:n]
    texts = dict(line.split(" ", 1) for line in (FSDD / "data/dev/text").read_text().splitlines())
    keys = [line.split()[0] for line in scp]
    (tmp_path / "wav.scp").write_text("".join(f"{k} {FSDD / w}\n" for k, w in (l.split() for l in scp))
                                      + f"gone {tmp_path / 'gone.opus'}\n")
    (tmp_path / "text").write_text("".join(f"{k} {texts[k]}\n" for k in keys) + "gone ONE\n")
    return keys, {k: str(FSDD / w) for k, w in (l.split() for l in scp)}


def test_flac_list_holds_the_same_samples_and_leaves_out_missing_audio(tmp_path):
    keys, sources = data_dir(tmp_path, 6)
    audio_dir, out = tmp_path / "audio", tmp_path / "data.list"
    proc = make_raw_list_cli("--audio_format", "flac", "--audio_dir", audio_dir, "--num_workers", 2,
                             tmp_path / "wav.scp", tmp_path / "text", out)
    assert proc.returncode == 0, proc.stderr
    assert f"{audio_dir}: 6 of 7 utterances as flac (0 already there), 1 left out" in proc.stdout
    assert "left out gone: missing_audio" in proc.stderr
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["key"] for e in entries] == keys
    for entry in entries:
        assert entry["wav"] == str(audio_dir / f"{entry['key']}.flac")
        flac, flac_rate = sf.read(entry["wav"], dtype="int16")
        source, source_rate = sf.read(sources[entry["key"]], dtype="int16")
        assert sf.info(entry["wav"]).subtype == "PCM_16" and flac_rate == source_rate == 16000
        assert flac.shape == source.shape and np.abs(flac.astype(int) - source.astype(int)).max() <= 1


def test_a_second_run_reuses_the_files_and_rewrites_only_what_is_missing(tmp_path):
    data_dir(tmp_path, 4)
    args = ["--audio_format", "flac", "--audio_dir", tmp_path / "audio", tmp_path / "wav.scp", tmp_path / "text",
            tmp_path / "data.list"]
    assert make_raw_list_cli(*args).returncode == 0
    files = sorted((tmp_path / "audio").glob("*.flac"))
    before = {f: f.stat().st_mtime_ns for f in files}
    files[1].unlink()
    (tmp_path / "audio" / "half.flac.tmp").write_bytes(b"\0" * 10)  # what a killed run leaves
    proc = make_raw_list_cli(*args)
    assert proc.returncode == 0 and "4 of 5 utterances as flac (3 already there)" in proc.stdout
    assert {f: f.stat().st_mtime_ns for f in files if f != files[1]} == {f: t for f, t in before.items()
                                                                         if f != files[1]}
    assert sf.info(str(files[1])).frames > 0

    args[1] = "wav"  # another format: the old files go
    assert make_raw_list_cli(*args).returncode == 0
    assert not list((tmp_path / "audio").glob("*.flac")) and len(list((tmp_path / "audio").glob("*.wav"))) == 4


def test_a_segment_is_cut_before_it_is_stored(tmp_path):
    wav = str(sorted((KATHLEEN / "audio").iterdir())[0])
    entries = [{"key": "seg", "wav": wav, "txt": "A", "start": 0.5, "end": 1.25}]
    stored, reused, skipped = reencode_audio(entries, str(tmp_path), "wav")
    assert (reused, skipped) == (0, []) and stored == [{"key": "seg", "wav": str(tmp_path / "seg.wav"), "txt": "A"}]
    whole, rate = sf.read(wav, dtype="int16")
    cut, _ = sf.read(stored[0]["wav"], dtype="int16")
    assert np.array_equal(cut, whole[round(0.5 * rate):round(1.25 * rate)])


@pytest.mark.parametrize("entry, audio_format, message", [
    ({"key": ".hidden", "wav": "x.opus", "txt": "A"}, "flac", "cannot name a file"),
    ({"key": "a", "wav": "x.opus", "txt": "A"}, "keep", "must be flac or wav"),
])
def test_bad_settings_raise(tmp_path, entry, audio_format, message):
    with pytest.raises(ValueError, match=message):
        reencode_audio([entry], str(tmp_path), audio_format)
    assert not os.listdir(tmp_path)


def test_a_format_without_a_folder_is_a_usage_error(tmp_path):
    data_dir(tmp_path, 1)
    proc = make_raw_list_cli("--audio_format", "flac", tmp_path / "wav.scp", tmp_path / "text", tmp_path / "out")
    assert proc.returncode == 2 and "--audio_format flac needs --audio_dir" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("line", ["utt1", "utt1   "])
def test_a_wav_scp_line_without_a_path_is_a_one_line_error_naming_file_and_line(tmp_path, line):
    # The case: `utt1` alone (or with trailing spaces) in wav.scp was written as "wav": "" and left to the
    # pipeline. In a text file the same line is an empty transcript, which is valid.
    keys, _ = data_dir(tmp_path, 3)
    scp = (tmp_path / "wav.scp").read_text().splitlines()
    (tmp_path / "wav.scp").write_text("\n".join(scp[:2] + [line] + scp[2:]) + "\n")
    (tmp_path / "text").write_text((tmp_path / "text").read_text() + "utt1\n")
    proc = make_raw_list_cli(tmp_path / "wav.scp", tmp_path / "text", tmp_path / "data.list")
    assert proc.returncode == 1 and not (tmp_path / "data.list").exists()
    assert proc.stderr == f"make_raw_list.py: {tmp_path / 'wav.scp'}:3: key 'utt1' has no value: expected " \
                          f"'key value'\n"
    (tmp_path / "wav.scp").write_text("\n".join(scp) + "\n")  # the key alone in text is an empty transcript
    proc = make_raw_list_cli(tmp_path / "wav.scp", tmp_path / "text", tmp_path / "data.list")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["key"] for line in (tmp_path / "data.list").read_text().splitlines()] == keys + ["gone"]
    assert "skipped 1 keys not in both" in proc.stderr and "utt1" in proc.stderr
