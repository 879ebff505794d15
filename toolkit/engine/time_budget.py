"""``train_conf.max_train_minutes``: a bound on the wall time of one training process, in minutes.

The bound M counts from :meth:`TimeBudget.start` (the ``training stops there`` log line, after the model is built
and the checkpoint saved or loaded) to the end of the last epoch's CV and save; the run ends by M plus at most one
optimizer step. Training steps stop at M less the *tail*: the CV + save of the epoch in progress (the time from the
end of an epoch's training to the start of the next), so that the epoch is cut short there and its CV and save
still end by M; no epoch starts whose loader's start-up (as long as the CV loader's last one) would end past that
point, and no ``step_N`` checkpoint is written whose save would end past it (the epoch is cut there instead).

The tail is the longest measured so far. Before the first one is measured (the first epoch of every start, a
resumed one included), it is estimated from a *CV probe* right after :meth:`TimeBudget.start`: every rank forwards,
as the CV does, a sample of :data:`CV_PROBE_UTTS` utterances spread evenly over its CV share (so batches of the
same lengths, padding and sizes), and global rank 0 scales its own probe to the largest rank's CV share
(:meth:`TimeBudget.cv_probed`): the loader's start-up plus the probe's forward time times the larger of the ratios
share / probed, in utterances and in audio seconds (a batch costs a fixed part plus a part growing with its audio:
the larger ratio bounds both); the save at most
:data:`SAVE_TO_LAST_IO` times this process's last checkpoint save or load (the ``init`` checkpoint, or the one it
resumed from). The probe costs one loader start-up and a few batches, inside the bound. A run that ends past M anyway
(one CV + save longer than M, or slower than the one kept back) says so (:meth:`TimeBudget.overrun_s`).

Global rank 0's clock decides and broadcasts every decision (each decision is a collective), so ranks whose clocks
disagree stop together. The bound is this process's: a resumed job has M minutes again. M = 0 disables the bound,
and then nothing is probed and no decision costs a collective.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

from toolkit.distributed.collectives import broadcast_from_main

# An epoch checkpoint holds the weights and up to two optimizer moments per weight (Adam); the init checkpoint only
# the weights, a resumed one all three.
SAVE_TO_LAST_IO = 3.0
# Utterances of each rank's CV share that the probe forwards before the first epoch of a bounded run.
CV_PROBE_UTTS = 64


@dataclass(frozen=True)
class CvShare:
    """``utts`` utterances and ``audio_s`` seconds of audio (None when unknown before reading it, e.g. shards) of
    CV data: the largest rank's share of a pass, or what a probe read."""

    utts: int
    audio_s: Optional[float] = None


class TimeBudget:
    """The deadline of ``max_train_minutes`` on a monotonic clock, from :meth:`start` on.

    Args:
        max_train_minutes: the bound M; 0 for none.
        clock: seconds on a monotonic clock (a stand-in in tests); only global rank 0's decides.
    """

    def __init__(self, max_train_minutes: float, clock: Callable[[], float] = time.monotonic):
        self.max_s = 60.0 * max_train_minutes
        self.clock = clock
        self.start()

    @property
    def bounded(self) -> bool:
        return self.max_s > 0

    @property
    def minutes(self) -> float:
        return self.max_s / 60

    def start(self, last_io_s: float = 0.0) -> None:
        """The run's training starts now: the deadline is M minutes away, no CV + save measured yet, the tail
        estimated as the save alone until :meth:`cv_probed`.

        Args:
            last_io_s: seconds of this process's last checkpoint save or load, what the save estimate scales.
        """
        # Rank 0's clock: when the run started, the epoch in progress its training ended, its last step ended; the
        # longest CV + save (None before one is measured) and its estimate until then; the CV loader's last start-up.
        self._started = self._train_ended = self._last_step = self.clock()
        self._longest_tail_s: Optional[float] = None
        self._save_s = SAVE_TO_LAST_IO * last_io_s
        self._tail_estimate_s = self._save_s
        self._loader_start_s = 0.0
        self._cut_step_late_s = 0.0  # how far past the deadline (at most its own length) the cut step ended

    @property
    def _deadline(self) -> float:
        if not self.bounded:
            return math.inf
        tail = self._tail_estimate_s if self._longest_tail_s is None else self._longest_tail_s
        return self._started + self.max_s - tail

    def cv_probed(self, probe_s: float, probed: CvShare, share: CvShare) -> float:
        """A CV probe ended now: it took ``probe_s`` seconds, the loader's start-up (the last
        :meth:`loader_started`) included, and forwarded ``probed``; ``share`` is the largest rank's CV share. Until
        a CV + save is measured, the tail is the start-up plus the probe's forward time scaled by the larger of the
        ratios ``share / probed`` (utterances; audio seconds where both are known), plus the save estimate.
        Returns that tail in seconds (the start-up and the save alone when the probe read no utterance)."""
        ratio = share.utts / probed.utts if probed.utts > 0 else 0.0
        if probed.utts > 0 and probed.audio_s and share.audio_s is not None:
            ratio = max(ratio, share.audio_s / probed.audio_s)
        forward_s = max(0.0, probe_s - self._loader_start_s)
        self._tail_estimate_s = self._loader_start_s + forward_s * ratio + self._save_s
        return self._tail_estimate_s

    def epoch_started(self) -> None:
        """An epoch's training starts now (its loader is about to start)."""
        self._last_step = self.clock()

    def step_past_deadline(self, saving_s: float = 0.0) -> bool:
        """Collective when bounded (every rank calls it after each optimizer step): whether training stops at this
        step (rank 0's decision): the step, followed by ``saving_s`` seconds of a ``step_N`` checkpoint due there
        (0 for none), ends past the deadline."""
        if not self.bounded:
            return False
        now = self.clock()
        past = now + saving_s >= self._deadline
        if past:
            self._cut_step_late_s = min(now - self._last_step, max(0.0, now - self._deadline))
        self._last_step = now
        return broadcast_from_main(past, "TimeBudget.step_past_deadline")

    def loader_started(self, since: float) -> None:
        """A loader started at ``since`` (this clock) yielded its first batch now: the start-up the next epoch's
        loader is expected to take (the CV loader's; the first training loader's also starts the worker server)."""
        self._loader_start_s = self.clock() - since

    def epoch_trained(self) -> None:
        """An epoch's training ended now (its CV and save follow)."""
        self._train_ended = self.clock()

    def next_epoch_fits(self) -> bool:
        """Collective when bounded (every rank calls it before each epoch but the run's first): keep the time since
        :meth:`epoch_trained` (CV + save) if it is the longest so far, move the deadline back by it, and say
        whether the next epoch may start: whether its loader's start-up, as long as the last measured by
        :meth:`loader_started`, ends before the deadline (rank 0's decision)."""
        if not self.bounded:
            return True
        now = self.clock()
        self._longest_tail_s = max(self._longest_tail_s or 0.0, now - self._train_ended)
        return not broadcast_from_main(now + self._loader_start_s >= self._deadline,
                                       "TimeBudget.next_epoch_fits")

    def seconds_left(self) -> float:
        """Seconds until training steps stop (inf without a bound); this process's clock, no collective."""
        return self._deadline - self.clock()

    def overrun_s(self) -> float:
        """Seconds the run is past the bound now beyond the last cut step's own lateness (the "plus one step" the
        bound allows), 0 within it; this process's clock, no collective."""
        return max(0.0, self.clock() - self._started - self.max_s - self._cut_step_late_s) if self.bounded else 0.0

    def minutes_used(self) -> float:
        """Minutes since :meth:`start`, on this process's clock."""
        return (self.clock() - self._started) / 60

    @property
    def longest_tail_s(self) -> float:
        """The longest CV + save so far, in seconds (0 before the first)."""
        return self._longest_tail_s or 0.0
