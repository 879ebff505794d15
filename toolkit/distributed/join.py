"""Join for uneven data: every rank stops at the same step, so no rank waits forever in a gradient all-reduce.

Ranks can hold different numbers of batches in an epoch (utterance counts that do not divide evenly, dynamic
batching, skipped audio). A rank that runs out while the others still all-reduce gradients would hang them until
the process-group timeout. Two modes (``train_conf.join_mode``, built by :func:`init_join`):

``flag`` (default, :class:`FlagJoin`): before each step every rank all-reduces one integer, "I have a batch", with
MIN on a dedicated gloo group; when any rank is out, every rank stops at that same step. The flag is reduced one
batch ahead, so every rank also knows which step is the epoch's last (``is_last``): a gradient accumulation cut
short by the epoch end still ends in an optimizer step instead of being thrown away (or, in DeepSpeed's ZeRO-2
buffers, leaking into the next epoch). The decision comes from the
data alone, never from a clock, so a rank that is only slow never shortens the epoch. It costs one tiny all-reduce
per step (see ``benchmarks/bench_join.py``).

``monitored_barrier`` (:class:`MonitoredBarrierJoin`, WeNet-compatible): the first batch is exempt from the clock
(an untimed MIN flag only checks that every rank has one); before every later batch each rank that still has one
calls ``dist.monitored_barrier(timeout=join_timeout_s)``; a rank with no batch left leaves the loop without
calling it, so the others time out and stop. Its per-step cost is about the
flag's (a barrier instead of an all-reduce), plus a full ``join_timeout_s`` wait at the end of every uneven epoch,
and it has a known flaw: a rank that is merely slower than the timeout (a stalled disk, a long batch, a GC pause)
ends the epoch for every rank. Worse, a rank that reaches the barrier just as a peer's
timeout expires can pass it while that peer gave up, and the ranks then mismatch collectives until the
process-group timeout. The group is created and destroyed in every ``iterate()`` because a gloo group that timed
out once fails every later barrier at once (each later epoch would silently train one batch). The rank that ran out
first goes on to the next collective on the default group and waits there for up to the join timeout, so the
process-group timeout must exceed ``join_timeout_s``.

In both modes, the batches a rank still held when another ran out are dropped for this epoch and reported to
``on_dropped`` so they are counted (the next epoch's shuffle deals every utterance anew); the join's collectives run
on their own group, never interleaving with the engine's gradient all-reduce on the default group.

We use neither DDP's ``model.join()`` nor ``no_sync`` shadow steps, because the joined rank stops stepping its
optimizer and LR scheduler while the others go on, so Adam moments and LR drift apart across replicas (and any
other collective inside the Join context aborts with a mismatch); DeepSpeed has no such context at all.
"""

from __future__ import annotations

import datetime
import logging
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from toolkit.distributed.context import DistContext
from toolkit.distributed.main_only import check_collective

JOIN_MODES = ("flag", "monitored_barrier")

# gloo's monitored_barrier on rank 0 with wait_all_ranks=True: "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier
# in 3000 ms"; other ranks only learn that rank 0 did not answer.
_MISSING_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


@dataclass
class JoinReport:
    """What the join saw on this rank in one epoch."""

    steps: int = 0  # batches yielded (the same on every rank)
    dropped: int = 0  # batches this rank still held when another rank ran out
    missing_ranks: str = ""  # monitored_barrier: ranks that did not reach the barrier ("unknown"; "" = no timeout)


def _ignore(batch: dict) -> None:
    """Default ``on_empty``/``on_dropped``: nothing to account for."""


class _Join:
    """Shared by both modes: skipping bookkeeping-only batches and draining the rest of the loader."""

    def __init__(self, is_empty: Callable[[dict], bool]):
        self.is_empty = is_empty
        self.report = JoinReport()
        # True while the batch just yielded is the last one every rank trains this epoch (flag mode knows it one
        # batch ahead; monitored_barrier mode never does), so a partial gradient accumulation still ends in a step.
        self.is_last = False

    def _next_real(self, it: Iterator, on_empty: Callable[[dict], None]) -> Optional[dict]:
        for batch in it:
            if not self.is_empty(batch):
                return batch
            on_empty(batch)
        return None

    def _drop_rest(self, batch: Optional[dict], it: Iterator, on_empty: Callable[[dict], None],
                   on_dropped: Callable[[dict], None]) -> None:
        """Drain the loader after the join stopped (so its workers finish and the dropped count is exact)."""
        while batch is not None:
            self.report.dropped += 1
            on_dropped(batch)
            batch = self._next_real(it, on_empty)
        if self.report.dropped:
            logging.info("join: stopped with the other ranks after %d batches, dropped %d batches of this rank",
                         self.report.steps, self.report.dropped)


class FlagJoin(_Join):
    """Iterate a data loader in lock-step with the other ranks (``join_mode: flag``).

    Create it once per training run on every rank (``new_group`` is itself collective). ``is_empty(batch)`` marks
    batches that carry no utterances (only bookkeeping); they are passed to ``on_empty`` and never count as a step.
    ``pg_timeout`` is the process-group timeout (``DistContext.pg_timeout``), which the join's group inherits.
    """

    def __init__(self, pg_timeout: datetime.timedelta, is_empty: Callable[[dict], bool] = lambda batch: False):
        super().__init__(is_empty)
        # NOTE: new_group's default timeout is torch's 30 min, not the default group's: a rank stuck in its data
        # loader would then hang the others for 30 min whatever init_distributed(timeout_s) said.
        self.group = dist.new_group(backend="gloo", timeout=pg_timeout)

    def iterate(self, loader: Iterable, on_empty: Callable[[dict], None] = _ignore,
                on_dropped: Callable[[dict], None] = _ignore) -> Iterator[dict]:
        """Yield this rank's batches while every rank still has one (a collective per batch, all ranks).

        ``on_dropped(batch)`` is called for each batch this rank still held when another rank ran out.

        Raises:
            CollectiveInMainOnlySection: called inside a main-only section.
        """
        check_collective("join")
        self.report = JoinReport()
        self.is_last = False
        it = iter(loader)
        batch = self._next_real(it, on_empty)
        every_rank_has_one = self._all_have(batch)
        while every_rank_has_one:
            # One batch of look-ahead: the flag for the next batch is reduced before this one is yielded, so every
            # rank learns together that this is the epoch's last step (still one all-reduce per step).
            upcoming = self._next_real(it, on_empty)
            every_rank_has_one = self._all_have(upcoming)
            self.is_last = not every_rank_has_one
            self.report.steps += 1
            yield batch
            batch = upcoming
        self._drop_rest(batch, it, on_empty, on_dropped)

    def _all_have(self, batch: Optional[dict]) -> bool:
        flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag)

    def close(self) -> None:
        """Destroy the join's group (every rank, after the last epoch)."""
        dist.destroy_process_group(self.group)


class MonitoredBarrierJoin(_Join):
    """WeNet-compatible join (``join_mode: monitored_barrier``): a timed barrier before every batch but the first.

    See the module docstring for the flaw (a rank slower than ``timeout_s`` ends the epoch for all). Every rank
    must call :meth:`iterate` once per epoch (it creates the epoch's gloo group, a collective).
    """

    def __init__(self, pg_timeout: datetime.timedelta, is_empty: Callable[[dict], bool] = lambda batch: False,
                 timeout_s: float = 30.0):
        """Raises:
            ValueError: ``timeout_s`` is not below the process-group timeout (the rank that ran out first would
                time out in its next collective before the others give up on the barrier).
        """
        super().__init__(is_empty)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.pg_timeout = pg_timeout
        if self.timeout >= pg_timeout:
            raise ValueError(f"join_timeout_s ({timeout_s} s) must be below the process-group timeout "
                             f"({pg_timeout.total_seconds()} s)")

    def _barrier(self, group) -> bool:
        """True when every rank reached the barrier in time; a timeout is logged as a join."""
        try:
            dist.monitored_barrier(group, timeout=self.timeout, wait_all_ranks=True)
        except RuntimeError as e:  # gloo raises RuntimeError for a timeout or a peer that already left
            found = _MISSING_RANKS.search(str(e))
            self.report.missing_ranks = found.group(1).strip() if found else "unknown"
            logging.info("join: monitored_barrier before batch %d timed out after %.1f s; missing rank(s): %s",
                         self.report.steps, self.timeout.total_seconds(), self.report.missing_ranks)
            return False
        return True

    def iterate(self, loader: Iterable, on_empty: Callable[[dict], None] = _ignore,
                on_dropped: Callable[[dict], None] = _ignore) -> Iterator[dict]:
        """Yield this rank's batches until it runs out or a barrier times out (all ranks, once per epoch).

        ``on_dropped(batch)`` is called for each batch this rank still held when the barrier timed out.

        Raises:
            CollectiveInMainOnlySection: called inside a main-only section.
        """
        check_collective("join")
        self.report = JoinReport()
        # NOTE: a fresh group per epoch: a gloo group that timed out once fails every later barrier instantly.
        group = dist.new_group(backend="gloo", timeout=self.pg_timeout)
        try:
            it = iter(loader)
            batch = self._next_real(it, on_empty)
            # The first batch is exempt from the clock, not from the join: one untimed "I have a batch" (MIN), so
            # a rank with no batch at all this epoch never leaves the others alone in the first gradient all-reduce.
            flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
            while batch is not None and bool(flag):
                if self.report.steps > 0 and not self._barrier(group):
                    break
                self.report.steps += 1
                yield batch
                batch = self._next_real(it, on_empty)
            self._drop_rest(batch, it, on_empty, on_dropped)
        finally:
            dist.destroy_process_group(group)

    def close(self) -> None:
        """Nothing to release: each epoch's group is destroyed at the end of :meth:`iterate`."""


def init_join(ctx: DistContext, join_mode: str, join_timeout_s: float,
              is_empty: Callable[[dict], bool] = lambda batch: False) -> FlagJoin | MonitoredBarrierJoin:
    """Build the join of ``join_mode`` (``train_conf.join_mode``; a collective: every rank calls it).

    Args:
        ctx: the rank context (its ``pg_timeout`` bounds the join's own group).
        join_mode: one of :data:`JOIN_MODES`.
        join_timeout_s: seconds a ``monitored_barrier`` waits for the other ranks.
        is_empty: marks batches that carry no utterances (never a step).

    Raises:
        ValueError: ``join_mode`` is not one of :data:`JOIN_MODES`, or ``join_timeout_s`` is not below the
            process-group timeout.
    """
    if join_mode == "flag":
        return FlagJoin(ctx.pg_timeout, is_empty)
    if join_mode == "monitored_barrier":
        return MonitoredBarrierJoin(ctx.pg_timeout, is_empty, float(join_timeout_s))
    raise ValueError(f"join_mode {join_mode!r} is not one of {list(JOIN_MODES)}")
