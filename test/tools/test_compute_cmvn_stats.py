import dataclasses
import json
import logging
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from toolkit.dataset import processor
from toolkit.dataset.cmvn_stats import compute_stats, read_entries
from toolkit.dataset.conf import FbankConf

from test.helpers import REPO_ROOT, kaldi_entries

DEV = REPO_ROOT / "corpora/tiny_fsdd/data/dev"
FBANK = dataclasses.asdict(FbankConf(dither=0.0))


def test_cmvn_stats_match_numpy_over_pipeline_fbank(tmp_path):
    wavs = [entry["wav"] for entry in kaldi_entries("tiny_fsdd", "dev")]
    data_list = tmp_path / "dev.list"
    data_list.write_text("".join(json.dumps({"key": str(i), "wav": w, "txt": "X"}) + "\n" for i, w in enumerate(wavs)))
    config = tmp_path / "train.yaml"
    config.write_text("dataset_conf:\n  fbank_conf:\n    num_mel_bins: 40\n    frame_shift: 10\n"
                      "    frame_length: 25\n    dither: 1.0\n")
    feats = np.concatenate([
        processor.compute_fbank(processor.read_audio({"wav": w}), num_mel_bins=40, frame_length=25.0,
                                frame_shift=10.0, dither=0.0)["feat"].numpy()
        for w in wavs]).astype(np.float64)
    outputs = []
    scp_source = ["--in_scp", DEV / "wav.scp", "--wav_root", REPO_ROOT / "corpora/tiny_fsdd"]
    for source in (["--in_data_list", data_list], scp_source):
        out = tmp_path / f"cmvn{len(outputs)}.json"
        subprocess.run([sys.executable, str(REPO_ROOT / "tools/compute_cmvn_stats.py"), *map(str, source),
                        "--train_config", str(config), "--num_workers", "2", "--out_cmvn", str(out)],
                       check=True, capture_output=True)
        outputs.append(json.loads(out.read_text()))
    for stats in outputs:
        assert stats["frame_num"] == feats.shape[0]
        np.testing.assert_allclose(stats["mean_stat"], feats.sum(axis=0), rtol=1e-9)
        np.testing.assert_allclose(stats["var_stat"], (feats ** 2).sum(axis=0), rtol=1e-9)
    mean = np.array(outputs[0]["mean_stat"]) / outputs[0]["frame_num"]
    var = np.array(outputs[0]["var_stat"]) / outputs[0]["frame_num"] - mean ** 2
    assert mean.shape == (40,) and (var > 0).all()
    assert mean == pytest.approx(feats.mean(axis=0))




def test_segment_lines_count_only_their_segment_and_skips_are_counted(tmp_path):
    wavs = [entry["wav"] for entry in kaldi_entries("tiny_fsdd", "dev")]
    spans = [(0.05, 0.15), (0.1, 0.2), (0.0, 0.12)]
    entries = [{"key": f"seg{i}", "wav": w, "txt": "X", "start": s, "end": e} for i, (w, (s, e)) in
               enumerate(zip(wavs, spans))]
    entries.append({"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "X"})
    data_list = tmp_path / "segments.list"
    data_list.write_text("".join(json.dumps(e) + "\n" for e in entries))
    feats = np.concatenate([processor.compute_fbank(processor.read_audio(e), **FBANK)["feat"].numpy()
                            for e in entries[:3]]).astype(np.float64)
    whole = sum(processor.compute_fbank(processor.read_audio({"wav": w}), **FBANK)["feat"].shape[0]
                for w in wavs[:3])
    assert feats.shape[0] < whole / 2  # the spans are short parts of their files
    out = tmp_path / "cmvn.json"
    config = tmp_path / "train.yaml"
    config.write_text("dataset_conf: {}\n")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools/compute_cmvn_stats.py"), "--in_data_list",
                           str(data_list), "--train_config", str(config), "--out_cmvn", str(out)],
                          capture_output=True, text=True, check=True)
    stats = json.loads(out.read_text())
    assert stats["frame_num"] == feats.shape[0]
    np.testing.assert_allclose(stats["mean_stat"], feats.sum(axis=0), rtol=1e-9)
    np.testing.assert_allclose(stats["var_stat"], (feats ** 2).sum(axis=0), rtol=1e-9)
    assert f"{feats.shape[0]} frames from 3 of 4 utterances; skipped by reason: {{'missing_audio': 1}}" in proc.stdout
    assert "skipping gone: missing_audio" in proc.stderr


def test_bad_lines_and_no_frames_are_one_line_errors(tmp_path):
    data_list = tmp_path / "data.list"
    data_list.write_text('{"key": "a", "wav": "a.wav", "txt": "A"}\n\n{"shard": "s.tar", "num_utts": 3}\n')
    with pytest.raises(ValueError, match=r"data.list:3: expected string fields key, wav, txt.*not a shard list"):
        read_entries(str(data_list), None, None)
    scp = tmp_path / "wav.scp"
    scp.write_text("a a.wav\nb\n")
    with pytest.raises(ValueError, match=r"wav.scp:2: expected 'key path', got 'b'"):
        read_entries(None, str(scp), None)
    scp.write_text(f"a {tmp_path}/a.wav\n")
    (tmp_path / "train.yaml").write_text("dataset_conf: {}\n")
    out = tmp_path / "cmvn.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools/compute_cmvn_stats.py"), "--in_scp", str(scp),
                           "--train_config", str(tmp_path / "train.yaml"), "--out_cmvn", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert re.search(r"no frames from the 1 utterances .*'missing_audio': 1.*not writing", proc.stderr)
    assert not out.exists()


@pytest.mark.parametrize("beside_a_thread", [False, True])
def test_a_worker_skip_reaches_the_log_once_in_its_format(tmp_path, beside_a_thread):
    # The case: beside another thread (a notebook's kernel, a rank) the pool's workers start from the forkserver,
    # with no log handler: their skip warnings bypassed the caller's format and log file.
    entries = kaldi_entries("tiny_fsdd", "dev")[:5] + [{"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "X"}]
    fbank = {key: value for key, value in FBANK.items() if key != "dither"}  # compute_stats sets it (0)
    handler = logging.FileHandler(tmp_path / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s rank0 %(levelname)s %(message)s"))
    root, stop = logging.getLogger(), threading.Event()
    root.addHandler(handler)
    if beside_a_thread:
        threading.Thread(target=stop.wait, daemon=True).start()
    try:
        stats, skipped = compute_stats(entries, fbank, 16000, num_workers=2)
    finally:
        stop.set()
        root.removeHandler(handler)
        handler.close()
    whole, _ = compute_stats(entries[:5], fbank, 16000, num_workers=1)
    assert skipped == {"missing_audio": 1} and stats["frame_num"] == whole["frame_num"]
    lines = [line for line in (tmp_path / "run.log").read_text().splitlines() if "skipping" in line]
    assert len(lines) == 1 and re.fullmatch(r"\d{4}-\d\d-\d\d [\d:,]+ rank0 WARNING skipping gone: missing_audio.*",
                                            lines[0]), lines
