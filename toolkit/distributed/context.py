"""The rank context: read the launcher's environment once and pass it along.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, and, for an elastic job, ``TORCHELASTIC_RUN_ID`` (its rendezvous id, the same for every attempt) and
``TORCHELASTIC_RESTART_COUNT``. :func:`init_distributed` reads them exactly once into a :class:`DistContext`;
nothing else in the toolkit reads these variables. A plain ``python train.py`` (no launcher) gets a one-process
group on an in-memory store, so the same code path (DDP wrap, collectives) runs for 1 CPU, 8 GPUs or 16 nodes.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.worker_start import stop_with_parent


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job.

    Attributes:
        rank: global rank in ``[0, world_size)``; rank 0 writes shared artifacts.
        world_size: number of processes in the job (all nodes).
        local_rank: rank on this node; selects the GPU.
        local_world_size: processes on this node.
        backend: ``"nccl"`` on GPU, ``"gloo"`` on CPU.
        device: the device this rank computes on.
        pg_timeout: the process-group timeout: a collective waiting longer fails instead of hanging; groups made
            later (the join's) must be given it, since ``new_group`` would default to torch's 30 minutes.
        run_id: torchrun's rendezvous id (``--rdzv_id``; a fresh one per ``--standalone`` launch), the same in every
            attempt of an elastic job; None without torchrun.
        restart_count: how many times torchrun has restarted the job's workers (0 in the first attempt).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = "gloo"
    device: torch.device = torch.device("cpu")
    pg_timeout: datetime.timedelta = datetime.timedelta(minutes=30)
    run_id: str | None = None
    restart_count: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


_CURRENT: DistContext | None = None
# How long the interpreter gives up the GIL at exit (see _hand_over_gil_at_exit); a GIL waiter wakes within
# microseconds, the margin is for a loaded machine.
_GIL_HANDOFF_S = 0.02


def _hand_over_gil_at_exit() -> None:
    """Give gloo's worker threads the GIL once more before the interpreter finalizes.

    A gloo worker thread frees a collective's tensors just after the collective has returned, and freeing a tensor
    that Python has seen takes the GIL. A thread that asks for the GIL once the interpreter is finalizing is ended
    inside C++ and the process aborts ("terminate called without an active exception", exit -6) after a run that
    had succeeded. Seen in about 4 of 10 runs here when DeepSpeed keeps a group alive past ``destroy_process_group``, so
    that its threads live until exit, and the last collective returned a few milliseconds before it. atexit
    functions run before finalizing starts; the sleep releases the GIL to whichever thread waits for it.
    """
    time.sleep(_GIL_HANDOFF_S)


def stop_with_launcher() -> None:
    """Under torchrun: end this rank as soon as its parent, torchrun's agent (``torchrun``, ``toolkit.bin.launch``),
    ends, however it ends, ``kill -9`` included (:func:`~toolkit.utils.worker_start.stop_with_parent`). A rank
    orphaned by a killed agent would otherwise train on with nobody to stop it, holding its model dir's lock so that
    the user's next run is refused; its end drops the lock (the kernel's). Without torchrun nothing: a plain
    ``python -m toolkit.bin.train`` outlives the shell that started it (``nohup``).

    NOTE: torchrun starts each rank in a session of its own (``start_new_session``), so neither a terminal's hangup
    nor a signal to the launcher's process group reaches the ranks. A rank's loader workers end with it
    (:func:`toolkit.dataset.loader.end_with_the_loader`), and its forkserver once the pipe to the rank closes (a
    server still importing what it preloads notices when it is done: seconds).
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        stop_with_parent()


def current_context() -> DistContext | None:
    """The context made by :func:`init_distributed` in this process, or None before it ran."""
    return _CURRENT


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def init_distributed(timeout_s: float = 1800.0) -> DistContext:
    """Create the default process group from the torchrun environment and return the rank context.

    On CPU each process gets ``cpu_count // local_world_size`` intra-op threads so that ranks on one node do not
    oversubscribe the cores (torchrun leaves ``OMP_NUM_THREADS`` unset for one process per node).

    Args:
        timeout_s: process-group timeout in seconds; a collective that waits longer fails instead of hanging.

    A rank of torchrun ends with its agent (:func:`stop_with_launcher`).

    Raises:
        ConfigError: with GPUs, a local rank beyond this node's GPU count (more processes per node than GPUs).
    """
    stop_with_launcher()
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        if local_rank >= torch.cuda.device_count():  # NOTE: else set_device's "invalid device ordinal" traceback
            raise ConfigError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}; start "
                              "at most that many processes per node (torchrun/run.sh --nproc_per_node)")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ or local_world_size == 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        atexit.register(_hand_over_gil_at_exit)
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        else:
            # NOTE: libraries that read the launcher's variables themselves (DeepSpeed asserts LOCAL_RANK) see the
            # one-process job a launcher would describe.
            for name in ("RANK", "LOCAL_RANK"):
                os.environ.setdefault(name, "0")
            for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
                os.environ.setdefault(name, "1")
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    ctx = DistContext(rank, world_size, local_rank, local_world_size, backend, device, timeout,
                      os.environ.get("TORCHELASTIC_RUN_ID"), _env_int("TORCHELASTIC_RESTART_COUNT", 0))
    global _CURRENT
    _CURRENT = ctx
    logging.info("rank %d/%d (local %d/%d) on %s, backend %s", rank, world_size, local_rank, local_world_size,
                 device, backend)
    return ctx


def destroy_distributed() -> None:
    """Tear the default process group down; without it gloo runs may abort at interpreter exit."""
    if dist.is_initialized():
        dist.destroy_process_group()
