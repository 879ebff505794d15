"""benchmarks/bench_runtime.py on a tiny conformer with seeded random weights, exported with --int8, and the 20
tiny_fsdd test clips: every runtime decodes every clip, torch and onnxruntime fp32 (the same features and greedy
search on equal log-probabilities) score the same errors, and the table names each runtime."""

import json
import os
import subprocess
import sys

import pytest

from test.helpers import REPO_ROOT
from test.multiprocess.workers.recognize_setup import fsdd_test_entries, write_list, write_model
from toolkit.bin import export

pytestmark = pytest.mark.multiprocess  # exports a model and runs the benchmark in its own process


def test_every_runtime_decodes_the_test_set_and_torch_equals_onnxruntime(tmp_path):
    write_model(tmp_path)
    model_dir, onnx_dir = tmp_path / "model", tmp_path / "onnx"
    export.main(["--model_dir", str(model_dir), "--checkpoint", "init.pt", "--out_dir", str(onnx_dir), "--int8"])
    data_list = write_list(tmp_path / "data.list", fsdd_test_entries())
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_runtime.py"), "--model_dir",
                           str(model_dir), "--checkpoint", "init.pt", "--onnx_dir", str(onnx_dir), "--test_data",
                           data_list, "--json", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    # full context: no streaming file, so no streaming row
    assert list(rows) == ["torch", "onnxruntime fp32", "onnxruntime int8", "sherpa-onnx", "sherpa-onnx int8"]
    assert result["utterances"] == 20 and 5 < result["audio_s"] < 15  # 20 digits of about half a second
    assert rows["torch"]["errors"] == rows["onnxruntime fp32"]["errors"]
    for row in rows.values():
        assert row["words"] == 20 and row["rtf"] > 0
    assert "| onnxruntime int8" in proc.stdout
