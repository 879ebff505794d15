"""benchmarks/bench_streaming.py on this toolkit's side alone (WeNet's needs its own venv): a side's process times
forward_chunk at chunk 16, 8 and 4 on the tiny_lj fbank, and the table states each chunk's algorithmic latency."""

import json
import subprocess
import sys

import pytest

from test.helpers import REPO_ROOT

pytestmark = pytest.mark.multiprocess  # the parent and a child process per side, each importing torch


def test_our_side_times_every_chunk_size(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_streaming.py"), "--config",
                           str(REPO_ROOT / "examples" / "english" / "s0" / "conf" / "train_tiny.yaml"), "--rounds", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["sides"]) == ["ours"] and result["encoder_conf"]["causal"] is True
    assert 85 < result["speech_s"] < 100  # tiny_lj's 15 utterances less the warm-up one
    ours = result["sides"]["ours"]
    assert ours["whole_rtf"] > 0
    for chunk, latency_ms in ((16, 700), (8, 380), (4, 220)):
        row = ours[f"chunk{chunk}"]
        assert row["algorithmic_latency_ms"] == pytest.approx(latency_ms)
        assert 0 < row["median_ms"] <= row["p95_ms"]
        assert row["rtf_vs_whole"] == pytest.approx(row["rtf"] / ours["whole_rtf"])
    assert "   16    700ms |" in proc.stdout
