"""The FSDD recipe run once per test session (run.sh stages -1..5 with conf/train_tiny.yaml, 2 gloo ranks): the
trained model dir that the recipe's own test checks and that the tests of what a user does with a model (transcribe,
export, other runtimes) start from, as a user does after ``bash run.sh``."""

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from test.helpers import REPO_ROOT

RECIPE_TIMEOUT_S = 1500  # about 10 min on 2 idle cores; a hang still fails here


@dataclass(frozen=True)
class RecipeRun:
    """Where the run wrote: ``data`` (stages -1..2), ``exp`` (the model dir: train.yaml, epoch_N.pt, avg_3.pt,
    RESULTS.md, <test set>/), ``tensorboard``; ``stdout`` of run.sh."""
    data: Path
    exp: Path
    tensorboard: Path
    stdout: str


@pytest.fixture(scope="session")
def fsdd_recipe(tmp_path_factory) -> RecipeRun:
    root = tmp_path_factory.mktemp("fsdd_recipe")
    data, exp, tensorboard = root / "data", root / "exp", root / "tensorboard"
    cmd = ["bash", os.path.join(REPO_ROOT, "run.sh"), "--corpora", "fsdd", "--train_config", "conf/train_tiny.yaml",
           "--data", str(data), "--dir", str(exp), "--tensorboard_dir", str(tensorboard),
           "--decode_modes", "ctc_greedy_search attention_rescoring"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RECIPE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return RecipeRun(data, exp, tensorboard, proc.stdout)
