"""Epoch statistics in one process without a process group: the sums and the skip counts (trained + skipped =
offered), the saver hook's round trip and resharding, the step log's rate and ETA, and the empty-pass check."""

import math

import pytest
import torch

from toolkit.engine.stats import EpochStats, RunningEpochStats, TrainingRate, require_utterances
from toolkit.utils.config_parsing import ConfigError


def batch(keys, frames=100, num_skipped=None) -> dict:
    return {"keys": keys, "feats_lengths": torch.tensor([frames] * len(keys)), "num_skipped": num_skipped or {}}


def test_epoch_stats_keep_trained_plus_skipped_equal_to_offered():
    stats = EpochStats()
    stats.add(batch(["a", "b", "c"], num_skipped={"too_short": 2}), 2.0, 0.01, torch.tensor([False, True, False]))
    stats.add(batch(["d", "e", "f"]), math.inf, 0.01)
    assert stats.num_utts == 2 and stats.loss_sum == 4.0 and stats.loss == 2.0
    assert dict(stats.skipped) == {"too_short": 2, "too_few_encoder_frames": 1, "non_finite_loss": 3}
    assert stats.num_utts + sum(stats.skipped.values()) == 3 + 2 + 3
    # Both batches reached the model: 6 utterances of 100 frames of 10 ms.
    assert stats.num_batches == 2 and stats.audio_s == pytest.approx(6.0)


def test_an_empty_or_dropped_batch_counts_only_its_skips_and_its_utterances():
    stats = EpochStats()
    stats.add(batch([], num_skipped={"empty_text": 3}), None)
    stats.add_dropped(batch(["a", "b"], num_skipped={"too_long": 1}))
    assert (stats.num_batches, stats.num_utts, stats.dropped_utts, stats.loss) == (0, 0, 2, 0.0)
    assert dict(stats.skipped) == {"empty_text": 3, "too_long": 1}


def test_reduce_without_a_process_group_is_this_ranks_sums():
    stats = EpochStats(num_batches=3, num_utts=7, loss_sum=3.5, audio_s=12.25, dropped_batches=1, dropped_utts=4,
                       skipped_steps=2)
    stats.skipped.update({"too_short": 2})
    assert stats.reduce() == stats


def test_the_running_stats_round_trip_and_reshard_onto_rank_0():
    running = RunningEpochStats()
    running.stats = EpochStats(num_batches=2, num_utts=5, loss_sum=2.5, skipped_steps=1)
    running.stats.skipped.update({"too_long": 2, "empty_text": 1})
    state = running.state_dict()
    restored = RunningEpochStats()
    restored.load_state_dict(state)
    assert restored.stats == running.stats and restored.stats.skipped["too_long"] == 2  # counts, not pairs
    other = dict(state, num_utts=3, loss_sum=1.0, skipped={"too_long": 1})
    first = RunningEpochStats.reshard([state, other], 0)
    assert (first["num_batches"], first["num_utts"], first["loss_sum"], first["skipped_steps"]) == (4, 8, 3.5, 1)
    assert first["skipped"] == {"too_long": 3, "empty_text": 1}
    second = RunningEpochStats.reshard([state, other], 1)
    assert (second["num_utts"], second["skipped"], second["skipped_steps"]) == (0, {}, 1)


def test_the_training_rate_counts_from_its_start():
    rate = TrainingRate(started_s=100.0, audio_s=50.0, num_utts=10)
    stats = EpochStats(num_utts=30, audio_s=250.0)
    assert rate.audio_per_s(stats, now_s=104.0) == 50.0  # 200 s of audio in 4 s
    assert rate.eta_s(stats, utts_total=90, now_s=104.0) == 12.0  # 20 utterances in 4 s, 60 to go
    assert rate.eta_s(stats, utts_total=30, now_s=104.0) is None  # done
    assert rate.eta_s(EpochStats(num_utts=10), utts_total=90, now_s=104.0) is None  # nothing trained since
    since = TrainingRate.since(stats)
    assert (since.audio_s, since.num_utts) == (250.0, 30)


def test_a_pass_on_no_utterance_stops_with_where_they_went():
    require_utterances(EpochStats(num_utts=1), "epoch 0 trained", "train.list")
    empty = EpochStats(dropped_utts=3, dropped_batches=1)
    empty.skipped.update({"too_long": 4})
    with pytest.raises(ConfigError, match=r"epoch 0 trained no utterance of train.list: 3 dropped at the join "
                                          r"\(1 batches\), skipped \{'too_long': 4\}"):
        require_utterances(empty, "epoch 0 trained", "train.list")
