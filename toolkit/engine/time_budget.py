"""``train_conf.max_train_minutes``: a bound on the wall time of one training process, in minutes.

Training steps stop at M minutes less the longest CV + save so far (the time from the end of an epoch's training
to the start of the next), so that the epoch in progress is cut short there and its CV and save still end by M; no
epoch starts past that point. Global rank 0's clock decides and broadcasts every decision (each decision is a
collective), so ranks whose clocks disagree stop together. The bound is this process's: a resumed job has M minutes
again. M = 0 disables the bound, and then no decision costs a collective.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from toolkit.distributed.collectives import broadcast_from_main


class TimeBudget:
    """The deadline of ``max_train_minutes`` on a monotonic clock, from :meth:`start` on.

    Args:
        max_train_minutes: the bound M; 0 for none.
        clock: seconds on a monotonic clock (a stand-in in tests); only global rank 0's decides.
    """

    def __init__(self, max_train_minutes: float, clock: Callable[[], float] = time.monotonic):
        self.max_s = 60.0 * max_train_minutes
        self.clock = clock
        # Rank 0's clock: when the run started, when its training steps must stop so that the last epoch's CV and
        # save still end within the bound, when this rank's last epoch of training ended, and the longest CV + save.
        self._started = self._train_ended = clock()
        self._deadline = math.inf
        self._longest_tail_s = 0.0

    @property
    def bounded(self) -> bool:
        return self.max_s > 0

    @property
    def minutes(self) -> float:
        return self.max_s / 60

    def start(self) -> None:
        """The run's training starts now: the deadline is M minutes away, no CV + save time kept yet."""
        self._started = self._train_ended = self.clock()
        self._deadline = self._started + self.max_s if self.bounded else math.inf
        self._longest_tail_s = 0.0

    def epoch_trained(self) -> None:
        """An epoch's training ended now (its CV and save follow)."""
        self._train_ended = self.clock()

    def next_epoch_fits(self) -> bool:
        """Collective when bounded (every rank calls it before each epoch but the run's first): keep the time since
        :meth:`epoch_trained` (CV + save) if it is the longest so far, move the deadline back by it, and say
        whether the next epoch may start (rank 0's decision)."""
        if not self.bounded:
            return True
        now = self.clock()
        self._longest_tail_s = max(self._longest_tail_s, now - self._train_ended)
        self._deadline = self._started + self.max_s - self._longest_tail_s
        return not broadcast_from_main(now >= self._deadline, "TimeBudget.next_epoch_fits")

    def step_past_deadline(self) -> bool:
        """Collective when bounded (every rank calls it after each optimizer step): whether training stops at this
        step (rank 0's decision)."""
        return self.bounded and broadcast_from_main(self.clock() >= self._deadline, "TimeBudget.step_past_deadline")

    def seconds_left(self) -> float:
        """Seconds until training steps stop (inf without a bound); this process's clock, no collective."""
        return self._deadline - self.clock()

    def minutes_used(self) -> float:
        """Minutes since :meth:`start`, on this process's clock."""
        return (self.clock() - self._started) / 60

    @property
    def longest_tail_s(self) -> float:
        """The longest CV + save so far, in seconds."""
        return self._longest_tail_s
