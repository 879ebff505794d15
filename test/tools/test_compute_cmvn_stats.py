import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from toolkit.dataset import processor

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "corpora/tiny_fsdd/data/dev"


def test_cmvn_stats_match_numpy_over_pipeline_fbank(tmp_path):
    wavs = [str(ROOT / "corpora/tiny_fsdd" / line.split()[1]) for line in (DEV / "wav.scp").read_text().splitlines()]
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
    scp_source = ["--in_scp", DEV / "wav.scp", "--wav_root", ROOT / "corpora/tiny_fsdd"]
    for source in (["--in_data_list", data_list], scp_source):
        out = tmp_path / f"cmvn{len(outputs)}.json"
        subprocess.run([sys.executable, str(ROOT / "tools/compute_cmvn_stats.py"), *map(str, source),
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
