"""Cross-validation under DeepSpeed ZeRO-3 on 2 real gloo ranks through ``toolkit.bin.train``: with a CV set of
one utterance, rank 1 has no CV batch at all. ZeRO-3 partitions every parameter (persistence threshold 0), so a
forward that gathered them on rank 0 alone would wait for rank 1 until the process-group timeout; the engine's
evaluation context gathers the model once on every rank instead, and the CV loss equals the ZeRO-2 run's."""

import json
import os

import pytest
import yaml

from .recipe_data import REPO, TIMEOUT_S, run_standalone, train_args, write_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    write_data(data)
    first = open(data / "cv.list").readline()
    (data / "cv.list").write_text(first)
    return data


def train_one_epoch(data_dir, model_dir, ds_config):
    args = train_args(data_dir, model_dir, "train_conf.max_epoch 1")
    # A hang would end at the 60 s process-group timeout (the last --pg_timeout_s wins).
    proc = run_standalone(args + ["--train_engine", "deepspeed", "--deepspeed_config", str(ds_config),
                                  "--pg_timeout_s", "60"], timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return yaml.safe_load(open(model_dir / "epoch_0.yaml"))


def test_zero3_cv_with_a_rank_that_has_no_cv_batch(data_dir, tmp_path):
    stage3 = json.load(open(os.path.join(REPO, "examples", "english", "s0", "conf", "ds_stage3.json")))
    stage3["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # partition even the smallest tensors
    stage3_path = tmp_path / "ds_stage3_all.json"
    stage3_path.write_text(json.dumps(stage3))
    zero3 = train_one_epoch(data_dir, tmp_path / "zero3", stage3_path)
    zero2 = train_one_epoch(data_dir, tmp_path / "zero2",
                            os.path.join(REPO, "examples", "english", "s0", "conf", "ds_stage2.json"))
    assert zero3["cv_utts"] == zero2["cv_utts"] == 1
    assert zero3["train_loss"] == pytest.approx(zero2["train_loss"], abs=1e-4)
    assert zero3["cv_loss"] == pytest.approx(zero2["cv_loss"], abs=1e-4)
