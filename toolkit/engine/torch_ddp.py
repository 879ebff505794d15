"""``train_engine: torch_ddp``: PyTorch DistributedDataParallel on nccl (GPU) or gloo (CPU).

Uneven data across ranks is handled outside the engine by :class:`toolkit.distributed.join.FlagJoin` (every rank
takes the same number of steps), so DDP's gradient all-reduce always has every rank present and DDP's own
``model.join()`` is not used (see that module for why).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ContextManager

import torch
from torch.nn.parallel import DistributedDataParallel

from toolkit.distributed.context import DistContext
from toolkit.engine.base import Engine
from toolkit.utils.checkpoint import MODEL_KEY, OPTIMIZER_KEY, SCALER_KEY, SCHEDULER_KEY


class TorchDDPEngine(Engine):
    """DDP engine. ``find_unused_parameters`` must be true when part of the model gets no gradient (for example
    the attention decoder when ``ctc_weight`` is 1.0)."""

    def __init__(self, ctx: DistContext, dtype: str, grad_clip: float, find_unused_parameters: bool = False):
        super().__init__(ctx, dtype, grad_clip)
        self.find_unused_parameters = find_unused_parameters
        self.scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None

    def prepare(self, model, optimizer, scheduler):
        model.to(self.ctx.device)
        device_ids = [self.ctx.local_rank] if self.ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids,
                                             find_unused_parameters=self.find_unused_parameters)
        self.optimizer = optimizer
        self.scheduler = scheduler
        return self.model

    def accumulate(self, sync: bool) -> ContextManager:
        return contextlib.nullcontext() if sync else self.model.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self) -> float:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        applied = math.isfinite(grad_norm)
        if self.scaler is not None:
            # NOTE: the scaler itself skips the update on inf/nan (the same test: the norm of the unscaled
            # gradients is then non-finite) and lowers its scale.
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif applied:
            self.optimizer.step()
        if applied:  # NOTE: a skipped update leaves the LR schedule where it is (Engine.step's rule)
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        state = {MODEL_KEY: self.module.state_dict(), OPTIMIZER_KEY: self.optimizer.state_dict(),
                 SCHEDULER_KEY: self.scheduler.state_dict()}
        if self.scaler is not None:
            state[SCALER_KEY] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state[MODEL_KEY])
        if OPTIMIZER_KEY in state:
            self.optimizer.load_state_dict(state[OPTIMIZER_KEY])
        if SCHEDULER_KEY in state:
            self.scheduler.load_state_dict(state[SCHEDULER_KEY])
        if self.scaler is not None and SCALER_KEY in state:
            self.scaler.load_state_dict(state[SCALER_KEY])
