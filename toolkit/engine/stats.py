"""Epoch statistics: sums over the batches of one pass, per rank until reduced over the job.

Every count is in utterances or batches, every duration in seconds. Utterances that reach the model but are not in
the loss sums are counted in ``skipped`` by reason, so trained + dropped + skipped = offered (see
:mod:`toolkit.engine.executor` for the reasons the trainer adds, :data:`NON_FINITE_LOSS` and
:data:`TOO_FEW_ENCODER_FRAMES`, to the pipeline's own).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from toolkit.distributed.collectives import all_gather_objects, all_reduce_sum
from toolkit.utils.config_parsing import ConfigError

NON_FINITE_LOSS = "non_finite_loss"
TOO_FEW_ENCODER_FRAMES = "too_few_encoder_frames"


@dataclass
class EpochStats:
    """Sums over one epoch (per rank until :meth:`reduce` makes them global)."""

    num_batches: int = 0
    num_utts: int = 0  # utterances in the loss sums
    loss_sum: float = 0.0  # sum over utterances of the per-utterance loss
    audio_s: float = 0.0
    skipped: Counter = field(default_factory=Counter)
    dropped_batches: int = 0  # held by this rank when another rank ran out (see toolkit.distributed.join)
    dropped_utts: int = 0  # utterances in those batches: num_utts + dropped_utts + sum(skipped) = data offered
    skipped_steps: int = 0  # optimizer steps skipped for a non-finite gradient norm (the same on every rank)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.num_utts, 1)

    @property
    def offered(self) -> int:
        """Utterances offered: in the loss sums, dropped or skipped."""
        return self.num_utts + self.dropped_utts + sum(self.skipped.values())

    def add(self, batch: dict, loss: float | None, frame_shift_s: float = 0.0,
            excluded: torch.Tensor | None = None) -> None:
        """Count ``batch``, its audio as ``feats_lengths`` frames of ``frame_shift_s`` seconds: ``loss`` None for one
        the model never saw (B=0); a non-finite ``loss`` counts all its utterances as skipped; ``excluded``
        (bool (B,)) marks those the model left out of a finite ``loss``."""
        self.skipped.update(batch.get("num_skipped", {}))
        num_utts = len(batch["keys"])
        if loss is None or num_utts == 0:
            return
        self.num_batches += 1
        self.audio_s += float(batch["feats_lengths"].sum()) * frame_shift_s
        if not math.isfinite(loss):
            self.skipped[NON_FINITE_LOSS] += num_utts
            return
        num_excluded = 0 if excluded is None else int(excluded.sum())
        if num_excluded:
            self.skipped[TOO_FEW_ENCODER_FRAMES] += num_excluded
        self.num_utts += num_utts - num_excluded
        self.loss_sum += loss * (num_utts - num_excluded)

    def add_dropped(self, batch: dict) -> None:
        """A batch the join dropped: its utterances count as dropped, its skip counts still count as skipped."""
        self.skipped.update(batch.get("num_skipped", {}))
        self.dropped_utts += len(batch["keys"])

    def reduce(self) -> "EpochStats":
        """All ranks: sum the statistics over the job (a collective; never call it inside a join block)."""
        sums = all_reduce_sum(torch.tensor([self.num_batches, self.num_utts, self.loss_sum, self.audio_s,
                                            self.dropped_batches, self.dropped_utts], dtype=torch.float64),
                              "EpochStats.reduce")
        skipped = Counter()
        for counter in all_gather_objects(dict(self.skipped), "EpochStats.reduce skipped"):
            skipped.update(counter)
        return EpochStats(num_batches=int(sums[0]), num_utts=int(sums[1]), loss_sum=float(sums[2]),
                          audio_s=float(sums[3]), skipped=skipped, dropped_batches=int(sums[4]),
                          dropped_utts=int(sums[5]), skipped_steps=self.skipped_steps)


class RunningEpochStats:
    """Saver hook (per rank): this rank's unreduced statistics of the epoch in progress, so that an epoch resumed
    from a ``step_N`` checkpoint still reports the whole epoch in its YAML."""

    def __init__(self):
        self.stats = EpochStats()

    def state_dict(self) -> dict:
        # NOTE: not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs, counting the pairs.
        return {f.name: copy.deepcopy(getattr(self.stats, f.name)) for f in dataclasses.fields(EpochStats)}

    def load_state_dict(self, state: dict) -> None:
        self.stats = EpochStats(**state)

    @staticmethod
    def reshard(states: list[dict], rank: int) -> dict:
        """The state of ``rank`` after a resume on another world size: rank 0 takes the sums of every saved rank's
        (so the reduced statistics still cover the whole epoch), the others start from zero; all keep the skipped
        optimizer steps, which are the same on every rank."""
        merged = RunningEpochStats()
        merged.stats.skipped_steps = states[0]["skipped_steps"]
        if rank == 0:
            for state in states:
                for name in ("num_batches", "num_utts", "loss_sum", "audio_s", "dropped_batches", "dropped_utts"):
                    setattr(merged.stats, name, getattr(merged.stats, name) + state[name])
                merged.stats.skipped.update(state["skipped"])
        return merged.state_dict()


@dataclass(frozen=True)
class TrainingRate:
    """This process's training speed from a start (that of an ``Executor.train`` call) on, for the step log and its
    ETA: the start in seconds on ``time.perf_counter``, and the epoch statistics' audio and utterances then."""

    started_s: float
    audio_s: float
    num_utts: int

    @classmethod
    def since(cls, stats: EpochStats) -> "TrainingRate":
        """From now, with ``stats`` as they stand."""
        return cls(time.perf_counter(), stats.audio_s, stats.num_utts)

    def audio_per_s(self, stats: EpochStats, now_s: float) -> float:
        """Seconds of audio trained per second of wall time since :attr:`started_s`."""
        return (stats.audio_s - self.audio_s) / max(now_s - self.started_s, 1e-9)

    def eta_s(self, stats: EpochStats, utts_total: int, now_s: float) -> float | None:
        """Seconds until ``stats.num_utts`` reaches ``utts_total`` at the rate since :attr:`started_s`; None before
        any utterance was trained since, or when ``utts_total`` is already reached."""
        if not utts_total > stats.num_utts > self.num_utts:
            return None
        return (now_s - self.started_s) / (stats.num_utts - self.num_utts) * (utts_total - stats.num_utts)


def require_utterances(stats: EpochStats, what: str, data_list: str) -> None:
    """Stop every rank (they hold the same reduced ``stats``) when a pass used no utterance at all: a model
    "trained" or scored on nothing must not produce checkpoints, a CV loss of 0 or a successful exit.

    Raises:
        ConfigError: naming ``data_list`` and where its utterances went (dropped at the join, skipped by reason).
    """
    if stats.num_utts > 0:
        return
    raise ConfigError(f"{what} no utterance of {data_list}: {stats.dropped_utts} dropped at the join "
                      f"({stats.dropped_batches} batches), skipped {dict(stats.skipped)}; check the data list and "
                      "data_type, and with shards make more shards than ranks x loader workers")
