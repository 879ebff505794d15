"""Run a worker script under torchrun with 2 gloo ranks and a hard timeout, so a hang fails the test fast."""

import os
import subprocess
import sys
from pathlib import Path

from test.helpers import REPO_ROOT, read_rank_reports

WORKERS = Path(__file__).resolve().parent  # the worker_*.py scripts


def run_ranks(script: str, *args: str, nproc: int = 2, timeout: float = 180, env: dict | None = None):
    """Launch ``script`` with ``torchrun --standalone --nproc_per_node nproc``; returns the CompletedProcess.

    Raises:
        subprocess.TimeoutExpired: the job did not finish in ``timeout`` seconds (a hang).
    """
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, *args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def train_engine_ranks(out_dir, *args: str, timeout: float = 240) -> list:
    """Run worker_engine.py (one engine's training steps) on 2 ranks writing to ``out_dir``; returns both ranks'
    reports (a non-zero exit fails the test with the ranks' output)."""
    os.makedirs(out_dir, exist_ok=True)
    proc = run_ranks(str(WORKERS / "worker_engine.py"), str(out_dir), *args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return read_rank_reports(out_dir, 2)
