"""Checkpoint policy in one process (a one-rank gloo group): retention choice, deletion order, saver hooks with
per-rank states, step and minute intervals, RNG capture, and the config keys' validation."""

import logging
import os
import random

import numpy as np
import pytest
import torch

from toolkit.engine import init_engine
from toolkit.engine.checkpointer import Checkpointer, checkpoints_to_delete, rank_by_cv_loss
from toolkit.engine.position import EpochPosition, TrainProgress
from toolkit.engine.stats import EpochStats, RunningEpochStats
from toolkit.utils.checkpoint import EXTRA_KEY, delete_checkpoint, load_checkpoint, save_checkpoint
from toolkit.engine.train_conf import resolve_train_conf
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.rng import RngState
from toolkit.utils.scheduler import init_optimizer_and_scheduler


def test_retention_keeps_the_newest_the_best_and_the_one_just_written():
    infos = {"step_2.pt": {"step": 2}, "step_4.pt": {"step": 4}, "epoch_0.pt": {"step": 5, "cv_loss": 3.0},
             "step_6.pt": {"step": 6}, "epoch_1.pt": {"step": 10, "cv_loss": 2.0}, "step_10.pt": {"step": 10},
             "step_12.pt": {"step": 12}, "epoch_2.pt": {"step": 15, "cv_loss": 2.5}}
    # Newest 2 by step (epoch_1 is newer than step_10 at the same step), plus the best epoch by cv_loss.
    assert checkpoints_to_delete(infos, 2, 1, "epoch_2.pt") == ["step_2.pt", "step_4.pt", "epoch_0.pt",
                                                                "step_6.pt", "step_10.pt"]
    # keep_best_n 2 also keeps epoch_2 (cv 2.5), already among the newest; epoch_0 (3.0) still goes.
    assert "epoch_0.pt" in checkpoints_to_delete(infos, 2, 2, "epoch_2.pt")
    # The checkpoint just written survives even when it is the oldest (e.g. after a resume from an early step).
    assert "step_2.pt" not in checkpoints_to_delete(infos, 1, 0, "step_2.pt")
    assert checkpoints_to_delete(infos, 0, 0, "epoch_2.pt") == []  # 0 keeps everything


def test_a_non_finite_cv_loss_never_ranks_as_best():
    # The nan-audio case's three epochs (13.5 / NaN / 11.0): sorted() leaves NaN where it stands, so epoch_1 (or
    # epoch_0, before it) came out "best". NaN, inf, a missing or a non-numeric cv_loss never rank.
    infos = {"epoch_0.pt": {"step": 5, "cv_loss": 13.5}, "epoch_1.pt": {"step": 10, "cv_loss": float("nan")},
             "epoch_2.pt": {"step": 15, "cv_loss": 11.0}, "epoch_3.pt": {"step": 20, "cv_loss": float("inf")},
             "epoch_4.pt": {"step": 25}, "epoch_5.pt": {"step": 30, "cv_loss": ".nan"},
             "step_7.pt": {"step": 7, "cv_loss": 1.0}}
    assert rank_by_cv_loss(infos) == ["epoch_2.pt", "epoch_0.pt"]
    # keep_last_n 1 (epoch_5) + keep_best_n 2: the two finite ones survive, the NaN epoch is deleted.
    assert checkpoints_to_delete(infos, 1, 2, "epoch_5.pt") == ["step_7.pt", "epoch_1.pt", "epoch_3.pt",
                                                                "epoch_4.pt"]


def test_delete_removes_the_commit_marker_first_and_the_shard_dir(tmp_path):
    path = str(tmp_path / "step_4.pt")
    save_checkpoint(path, {"model": {}}, {"step": 4})
    os.makedirs(tmp_path / "step_4")
    (tmp_path / "step_4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
    assert delete_checkpoint(path) == [str(tmp_path / "step_4.yaml"), path, str(tmp_path / "step_4")]
    assert os.listdir(tmp_path) == []
    assert delete_checkpoint(path) == []  # a second delete is no error


def make_engine(ctx):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer, scheduler = init_optimizer_and_scheduler(model.parameters(), "adam", {"lr": 0.1}, "warmuplr",
                                                        {"warmup_steps": 2})
    engine = init_engine("torch_ddp", ctx, resolve_train_conf({}), find_unused_parameters=False)
    engine.prepare(model, optimizer, scheduler)
    return engine


def test_hooks_round_trip_main_and_per_rank_state(one_rank, tmp_path):
    conf = resolve_train_conf({"save_interval_steps": 3})
    checkpointer = Checkpointer(make_engine(one_rank), str(tmp_path), conf)
    progress, running = TrainProgress(epoch=1, step=6, batches_in_epoch=2, data_seed=5), RunningEpochStats()
    running.stats = EpochStats(num_batches=2, num_utts=7, loss_sum=3.5)
    running.stats.skipped.update({"too_long": 2})
    checkpointer.register("progress", progress)
    checkpointer.register("rng", RngState(), main_process_only=False)
    checkpointer.register("epoch_stats", running, main_process_only=False)
    with pytest.raises(ValueError, match="already registered"):
        checkpointer.register("progress", progress)
    with pytest.raises(TypeError, match="state_dict"):
        checkpointer.register("plain", object())
    assert [checkpointer.step_due(s) for s in (1, 2, 3, 6)] == [False, False, True, True]

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = checkpointer.save("step_6", {"epoch": 1, "step": 6})
    expected = (random.random(), np.random.rand(), torch.rand(1))
    extra = load_checkpoint(path)[EXTRA_KEY]
    assert extra["main"]["progress"]["batches_in_epoch"] == 2 and len(extra["per_rank"]["rng"]) == 1

    progress.load_state_dict(TrainProgress().state_dict())
    running.stats = EpochStats()
    assert checkpointer.load(path) == ["progress", "rng", "epoch_stats"]
    assert (progress.epoch, progress.step, progress.batches_in_epoch, progress.data_seed) == (1, 6, 2, 5)
    assert (running.stats.num_utts, running.stats.loss_sum, running.stats.skipped) == (7, 3.5, {"too_long": 2})
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])


def test_per_rank_state_of_another_world_size_is_not_restored(one_rank, tmp_path, caplog):
    engine = make_engine(one_rank)
    path = str(tmp_path / "step_1.pt")
    state = engine.state_dict()
    state[EXTRA_KEY] = {"main": {}, "per_rank": {"epoch_stats": [{"num_utts": 1}, {"num_utts": 2}]},
                        "world_size": 2}
    save_checkpoint(path, state, {"step": 1})
    checkpointer = Checkpointer(engine, str(tmp_path), resolve_train_conf({}))
    running = RunningEpochStats()
    checkpointer.register("epoch_stats", running, main_process_only=False)
    with caplog.at_level(logging.WARNING):
        assert checkpointer.load(path) == []
    assert "saved by 2 ranks, this job has 1" in caplog.text and running.stats.num_utts == 0


def test_a_resharded_per_rank_state_merges_every_saved_rank(one_rank, tmp_path, caplog):
    engine = make_engine(one_rank)
    path = str(tmp_path / "step_1.pt")
    saved = []
    for num_utts, skipped, batches_read in ((3, {"too_long": 1}, {0: (2, True), 2: (1, False)}),
                                            (4, {"too_long": 2, "empty_text": 1}, {0: (1, False), 1: (1, False)})):
        running = RunningEpochStats()
        running.stats = EpochStats(num_batches=1, num_utts=num_utts, loss_sum=num_utts / 2, skipped_steps=1)
        running.stats.skipped.update(skipped)
        saved.append((running.state_dict(), {"batches_read": batches_read}))
    state = engine.state_dict()
    state[EXTRA_KEY] = {"main": {}, "per_rank": {"epoch_stats": [s for s, _ in saved],
                                                 "epoch_position": [p for _, p in saved]}, "world_size": 2}
    save_checkpoint(path, state, {"step": 1})
    checkpointer = Checkpointer(engine, str(tmp_path), resolve_train_conf({}))
    running, position = RunningEpochStats(), EpochPosition()
    checkpointer.register("epoch_stats", running, main_process_only=False, reshard=RunningEpochStats.reshard)
    checkpointer.register("epoch_position", position, main_process_only=False, reshard=EpochPosition.reshard)
    with caplog.at_level(logging.INFO):
        assert checkpointer.load(path) == ["epoch_stats", "epoch_position"]
    assert "epoch_stats of 2 ranks resharded for 1" in caplog.text
    # This one rank holds both ranks' sums (a second rank would start from zero) and every part either read (of
    # part 0, which both knew of after an earlier reshard, the furthest).
    stats = running.stats
    assert (stats.num_batches, stats.num_utts, stats.loss_sum, stats.skipped_steps) == (2, 7, 3.5, 1)
    assert stats.skipped == {"too_long": 3, "empty_text": 1}
    assert RunningEpochStats.reshard([s for s, _ in saved], 1)["num_utts"] == 0
    assert position.batches_read == {0: (2, True), 1: (1, False), 2: (1, False)}


def test_minutes_interval_follows_the_clock_and_retention_deletes(one_rank, tmp_path, caplog):
    now = [0.0]
    conf = resolve_train_conf({"save_interval_minutes": 1.0, "keep_last_n": 1, "keep_best_n": 0})
    checkpointer = Checkpointer(make_engine(one_rank), str(tmp_path), conf, clock=lambda: now[0])
    now[0] = 59.0
    assert not checkpointer.step_due(1)
    now[0] = 60.0
    assert checkpointer.step_due(2)
    with caplog.at_level(logging.INFO):
        checkpointer.save("step_2", {"step": 2})
        assert not checkpointer.step_due(3)  # the clock restarts at each save
        checkpointer.save("step_3", {"step": 3})
    assert sorted(os.listdir(tmp_path)) == ["step_3.pt", "step_3.yaml"]
    assert f"rank 0 deleted {tmp_path / 'step_2.yaml'}, {tmp_path / 'step_2.pt'}" in caplog.text


@pytest.mark.parametrize("key,value", [("keep_last_n", -1), ("save_interval_steps", 1.5),
                                       ("save_interval_minutes", -0.5), ("keep_best_n", True)])
def test_bad_checkpoint_keys_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=key):
        resolve_train_conf({key: value})
