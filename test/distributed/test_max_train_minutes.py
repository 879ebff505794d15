"""``train_conf.max_train_minutes`` on 2 real gloo ranks whose clocks disagree: global rank 0's clock decides
before each epoch whether the next one would end past the bound, and both ranks stop after the same epoch (one
deciding on its own clock would leave the other in a collective alone)."""

import json
import os

import pytest

from .launch import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_time_bound.py")


@pytest.mark.parametrize("max_train_minutes, epochs", [
    (10 / 60, [0, 1]),  # 4 s an epoch: after epoch 1, 8 s + 4 s would pass 10 s
    (12 / 60, [0, 1, 2]),  # 12 s exactly fits the third epoch
    (0.0, list(range(10))),  # disabled: max_epoch
])
def test_rank_0_clock_stops_every_rank_after_the_same_epoch(tmp_path, max_train_minutes, epochs):
    proc = run_ranks(WORKER, str(tmp_path), str(max_train_minutes), timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert reports[0] == reports[1] == {"epochs": epochs, "steps": 4 * len(epochs)}
    announced = f"train_conf.max_train_minutes {max_train_minutes:g}: no epoch starts that would end past it"
    assert (announced in proc.stderr) == bool(max_train_minutes)
    if max_train_minutes:
        assert (f"train_conf.max_train_minutes {max_train_minutes:g}: stopping after epoch {epochs[-1]} of max_epoch 10"
                in proc.stderr)
