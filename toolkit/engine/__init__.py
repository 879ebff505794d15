"""Training engines behind one interface; :func:`init_engine` is the only place that reads ``train_engine``."""

from __future__ import annotations

from toolkit.distributed.context import DistContext
from toolkit.engine.base import Engine
from toolkit.engine.torch_ddp import TorchDDPEngine

ENGINE_CHOICES = ("torch_ddp",)

__all__ = ["ENGINE_CHOICES", "Engine", "init_engine"]


def init_engine(train_engine: str, ctx: DistContext, train_conf: dict, find_unused_parameters: bool) -> Engine:
    """Create the engine named by ``--train_engine``.

    Raises:
        ValueError: an unknown engine name (the message lists the valid ones).
    """
    if train_engine not in ENGINE_CHOICES:
        raise ValueError(f"--train_engine {train_engine!r} is not one of {list(ENGINE_CHOICES)}")
    return TorchDDPEngine(ctx, train_conf["dtype"], train_conf["grad_clip"], find_unused_parameters)
