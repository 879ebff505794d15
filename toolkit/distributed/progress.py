"""Whole-job progress without collectives, and a finish line that does not time out.

Every rank adds what it has done to a counter in the process group's key-value store (the c10d store that torchrun
set up; ``add`` is an atomic increment answered by the store, not a collective, so a rank never waits for another
one to make progress). Global rank 0 shows one tqdm bar for the whole job, read from that counter by a background
thread. :meth:`JobProgress.finish` marks the rank done and polls the store until every rank is done, or one
failed (an exception inside the ``with JobProgress(...)`` block of any rank ends the wait of the others).

NOTE: a rank with a small share (or none) reaches the end long before the others. Waiting for them inside a
collective would fail once the process-group timeout passes (30 minutes by default) on a long test set; polling
the store has no such limit, and the collectives after it (gathering the results) then start together. A rank
killed outright (no exception) is not seen here; torchrun then stops the job's other processes on its node, and
waiting ranks elsewhere log every ``wait_log_s``.

Cost (``tools/bench_decode.py``, 2 shared CPU cores, 2,000 utterances in batches of 32): one ``add`` per batch,
63 calls took 15-190 ms in all on one rank (0.2-3 ms each, most of it waiting for the store's process to be
scheduled), under 0.1 % of the 40-800 s of decoding.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import torch.distributed as dist
from tqdm import tqdm

from toolkit.distributed.main_only import check_collective

_instances = itertools.count()


def _job_store() -> dist.Store:
    # NOTE: torch exposes the default group's store only through this private accessor; it is the store every
    # rank already shares (torchrun's TCPStore, or the in-memory store of a one-process group).
    return dist.distributed_c10d._get_default_store()


class JobProgress:
    """Progress of a job-wide count (utterances, say) summed over ranks through the store.

    Every rank must create it, in the same order relative to other ``JobProgress`` objects (the n-th one of each
    rank shares the n-th counter), after the process group exists.

    Args:
        total: the count the whole job reaches (the bar's total).
        desc, unit: tqdm's bar label and unit.
        poll_s: seconds between two reads of the counter (the bar's refresh, the finish line's latency).
        wait_log_s: a rank waiting in :meth:`finish` logs how many ranks are still running this often.
    """

    def __init__(self, total: int, desc: str = "progress", unit: str = "it", poll_s: float = 0.5,
                 wait_log_s: float = 300.0):
        self.store = dist.PrefixStore(f"job_progress/{next(_instances)}/", _job_store())
        self.world_size = dist.get_world_size()
        self.poll_s = poll_s
        self.wait_log_s = wait_log_s
        self.add_calls, self.add_s = 0, 0.0
        self._stop = threading.Event()
        self._thread = None
        if dist.get_rank() == 0:
            self._bar = tqdm(total=total, desc=desc, unit=unit)
            self._thread = threading.Thread(target=self._refresh, name="job-progress", daemon=True)
            self._thread.start()

    def add(self, n: int) -> None:
        """Count ``n`` more units done by this rank (one store round trip; nothing when ``n`` is 0). The calls
        and the seconds they took are kept in ``add_calls`` and ``add_s``, to show what the bar costs."""
        if n:
            start = time.perf_counter()
            self.store.add("done", n)
            self.add_s += time.perf_counter() - start
            self.add_calls += 1

    def done(self) -> int:
        """Units done by all ranks so far."""
        return self.store.add("done", 0)

    def _refresh(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._bar.update(self.done() - self._bar.n)

    def __enter__(self) -> "JobProgress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:  # NOTE: tell the ranks waiting in finish() instead of leaving them to wait forever
            self.store.add("failed", 1)
            self._close_bar()

    def finish(self) -> None:
        """Mark this rank finished and return once every rank is. Call it on every rank, right before the
        collectives that end the job (it is not a collective, but it waits for all ranks like one). Leaving the
        ``with`` block calls it; an exception leaving the block marks this rank failed instead.

        Raises:
            CollectiveInMainOnlySection: called inside a main-only section (the other ranks never get there).
            RuntimeError: another rank left its ``with`` block with an exception.
        """
        check_collective("JobProgress.finish")
        finished = self.store.add("finished", 1)
        last_log = time.monotonic()
        while finished < self.world_size:
            time.sleep(self.poll_s)
            if self.store.add("failed", 0):
                self._close_bar()
                raise RuntimeError("another rank failed before finishing (its log has the error)")
            finished = self.store.add("finished", 0)
            if time.monotonic() - last_log > self.wait_log_s:
                logging.info("waiting for %d of %d ranks to finish", self.world_size - finished, self.world_size)
                last_log = time.monotonic()
        self._close_bar()

    def _close_bar(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._bar.update(self.done() - self._bar.n)
            self._bar.close()
