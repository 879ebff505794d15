"""Join for uneven data: every rank stops at the same step, decided by data, never by a clock.

Ranks can hold different numbers of batches in an epoch (utterance counts that do not divide evenly, dynamic
batching, skipped audio). A rank that runs out while the others still all-reduce gradients would hang them until
the process-group timeout. Before each step, :class:`FlagJoin` all-reduces one integer, "I have a batch", with MIN
on a dedicated gloo group: when any rank is out, every rank stops at that same step, and the batches the others
still held are counted as dropped (they come first in another epoch's shuffle).

Why not DDP's ``model.join()``: the joined rank stops stepping its optimizer and LR scheduler while the others go on,
so Adam moments and the LR differ across ranks afterwards and the replicas drift apart. Why not a
``monitored_barrier`` with a timeout (WeNet): a rank that is only slow for longer than the timeout ends the epoch
for everyone. The flag costs one tiny all-reduce per step on its own group, so it never interleaves with the
engine's gradient collectives on the default group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from toolkit.distributed.main_only import check_collective


@dataclass
class JoinReport:
    """What the join saw on this rank in one epoch."""

    steps: int = 0  # batches yielded (the same on every rank)
    dropped: int = 0  # batches this rank still held when another rank ran out


class FlagJoin:
    """Iterate a data loader in lock-step with the other ranks.

    Create it once per training run on every rank (``new_group`` is itself collective). ``is_empty(batch)`` marks
    batches that carry no utterances (only bookkeeping); they are passed to ``on_empty`` and never count as a step.
    """

    def __init__(self, is_empty: Callable[[dict], bool] = lambda batch: False):
        self.group = dist.new_group(backend="gloo")
        self.is_empty = is_empty
        self.report = JoinReport()

    def _next_real(self, it: Iterator, on_empty: Callable[[dict], None]):
        for batch in it:
            if not self.is_empty(batch):
                return batch
            on_empty(batch)
        return None

    def iterate(self, loader: Iterable, on_empty: Callable[[dict], None] = lambda batch: None) -> Iterator[dict]:
        """Yield this rank's batches while every rank still has one. Drains the rest afterwards (so the loader's
        workers finish and the dropped count is exact)."""
        check_collective("join")
        self.report = JoinReport()
        it = iter(loader)
        while True:
            batch = self._next_real(it, on_empty)
            flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
            if int(flag) == 0:
                break
            self.report.steps += 1
            yield batch
        while batch is not None:
            self.report.dropped += 1
            batch = self._next_real(it, on_empty)
        if self.report.dropped:
            logging.info("join: stopped with the other ranks after %d batches, dropped %d batches of this rank",
                         self.report.steps, self.report.dropped)

    def close(self) -> None:
        dist.destroy_process_group(self.group)
