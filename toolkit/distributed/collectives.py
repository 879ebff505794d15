"""The collectives the trainer uses besides the engine's gradient all-reduce and the join's flag, in one place.

Each is called by every rank at the same point (a rank that skips one hangs the others until the process-group
timeout), and each first calls :func:`~toolkit.distributed.main_only.check_collective`, so one reached inside a
main-only section raises at once instead. Without a process group (a single process outside ``init_distributed``)
each returns what the one rank holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from toolkit.distributed.main_only import check_collective


def _on_backend(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` where the default group's backend can reduce it (nccl: the current GPU; gloo: the CPU)."""
    if dist.get_backend() == "nccl":
        return tensor.to(torch.device("cuda", torch.cuda.current_device()))
    return tensor


def all_reduce_sum(values: torch.Tensor, call: str) -> torch.Tensor:
    """Sum ``values`` (a CPU tensor, any shape; float64 keeps counts and loss sums exact) over the ranks; returns
    the sums on the CPU."""
    check_collective(call)
    if not dist.is_initialized():
        return values
    values = _on_backend(values)
    dist.all_reduce(values)
    return values.cpu()


def all_gather_objects(obj: Any, call: str) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    check_collective(call)
    if not dist.is_initialized():
        return [obj]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def gather_objects(obj: Any, call: str) -> list | None:
    """Every rank's ``obj`` in rank order on global rank 0; None on the other ranks."""
    check_collective(call)
    if not dist.is_initialized():
        return [obj]
    main = dist.get_rank() == 0
    gathered: list | None = [None] * dist.get_world_size() if main else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def broadcast_from_main(flag: bool, call: str) -> bool:
    """Global rank 0's ``flag`` on every rank (a decision rank 0 takes alone, e.g. from its clock)."""
    check_collective(call)
    if not dist.is_initialized():
        return flag
    tensor = _on_backend(torch.tensor([int(flag)], dtype=torch.int32))
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def broadcast_object_from_main(obj: Any, call: str) -> Any:
    """Global rank 0's ``obj`` (picklable) on every rank; what the other ranks pass is ignored (a choice rank 0
    makes alone, e.g. from the files it sees)."""
    check_collective(call)
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
