"""benchmarks/bench_checkpointing.py: each variant runs in its own process and executes more FLOPs the more it
recomputes (the layers' forwards, then the front end's too)."""

import json
import subprocess
import sys

import pytest

from test.helpers import REPO_ROOT

pytestmark = pytest.mark.multiprocess  # each variant trains in a process of its own


def test_each_variant_recomputes_more(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_checkpointing.py"),
                           "--config", str(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"), "--batch_size", "2",
                           "--frames", "300", "--steps", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "layers+front_end" in proc.stdout
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert results.keys() == {"none", "layers", "layers+front_end"}
    assert results["none"]["gflops"] < results["layers"]["gflops"] < results["layers+front_end"]["gflops"]
    for r in results.values():
        assert len(r["step_s"]) == len(r["step_cpu_s"]) == 2 and r["peak_rss_mib"] >= r["rss_before_mib"] > 100
