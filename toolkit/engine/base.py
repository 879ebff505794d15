"""The engine interface: everything that differs between training back-ends lives behind these verbs.

The executor and ``bin/train.py`` talk to an :class:`Engine` only; the string ``train_engine`` is read once, in
:func:`toolkit.engine.init_engine`. An engine owns the wrapped model, the optimizer, the LR scheduler and the
mixed-precision state, and knows how to save and load them.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, ContextManager, Iterator

import torch

from toolkit.distributed.context import DistContext
from toolkit.distributed.main_only import check_collective, run_on_main
from toolkit.utils.checkpoint import (EXTRA_KEY, MODEL_KEY, OPTIMIZER_SHARDS_KEY, check_model_state,
                                      load_checkpoint, save_checkpoint)
from toolkit.utils.config_parsing import ConfigError

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_dtype(dtype: str, device_type: str) -> None:
    """Raises ConfigError for ``fp16`` on a device other than ``"cuda"`` (CPU autocast has no fp16 loss scaling)."""
    if dtype == "fp16" and device_type != "cuda":
        raise ConfigError("train_conf.dtype fp16 needs a GPU; use bf16 or fp32 on CPU")


class Engine(abc.ABC):
    """One training back-end (torch DDP, DeepSpeed, torch FSDP2).

    Args:
        ctx: the rank context.
        dtype: ``"fp32"``, ``"bf16"`` (autocast on CPU and GPU) or ``"fp16"`` (GPU only, with loss scaling).
        grad_clip: max global L2 norm of the gradients; 0 disables clipping (the norm is still reported).

    Raises:
        ConfigError: ``fp16`` requested without a GPU (CPU autocast has no fp16 loss scaling).
    """

    def __init__(self, ctx: DistContext, dtype: str, grad_clip: float):
        check_dtype(dtype, ctx.device.type)
        self.ctx = ctx
        self.dtype = dtype
        self.grad_clip = grad_clip
        self.model: torch.nn.Module | None = None

    @abc.abstractmethod
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LRScheduler) -> torch.nn.Module:
        """Move ``model`` to the rank's device, wrap it for data parallelism and take ownership of the optimizer and
        scheduler. Returns the wrapped model (call it for forward)."""

    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped model, for evaluation without collectives and for ``state_dict`` (both DDP and DeepSpeed
        wrappers keep it as ``.module``)."""
        return self.model.module

    def autocast(self) -> ContextManager:
        """Mixed-precision context for the forward pass (a no-op for fp32)."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=PRECISIONS[self.dtype])

    def evaluation(self) -> ContextManager:
        """Context around a whole evaluation pass of :attr:`module` on this rank's share of the data. Entered by
        every rank (it may be collective); inside it a forward issues no collective, so ranks may run different
        numbers of batches, none included. Here: nothing to do (every rank holds the whole model)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def accumulate(self, sync: bool) -> ContextManager:
        """Context around forward+backward of one micro-batch; ``sync=False`` skips the gradient all-reduce
        (gradient accumulation, ``accum_grad`` > 1)."""

    def grad_leaves(self) -> list[torch.Tensor]:
        """The tensors the backward pass accumulates gradients into: the parameters of :attr:`module` that require
        one (an engine whose forward runs on other tensors, as FSDP's gathered parameters, names those)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def gradients_zeroed(self) -> Iterator[None]:
        """Inside, every gradient arriving at a tensor of :meth:`grad_leaves` is replaced by zeros before it is
        accumulated into ``.grad``, hence before the engine's reduction reads it (a batch whose loss is not finite).
        The backward pass itself still runs, so the engine's collectives see the same parameters as for any other
        batch."""
        handles = [leaf.register_hook(torch.zeros_like) for leaf in self.grad_leaves()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @abc.abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (already divided by ``accum_grad``)."""

    @abc.abstractmethod
    def step(self) -> float:
        """Clip, take one optimizer and scheduler step, zero the gradients. Returns the pre-clip global gradient
        norm (the same on every rank).

        The rule every engine follows: a non-finite norm skips the update on every rank, and the LR scheduler does
        not advance either (the schedule counts applied updates: DeepSpeed's rule on an fp16 overflow, and
        Megatron-LM's); the gradients are dropped and the norm is still returned so the caller can log it."""

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Drop accumulated gradients (e.g. an incomplete accumulation at the end of an epoch)."""

    @property
    def lr(self) -> float:
        """Current learning rate of the first parameter group."""
        return self.optimizer.param_groups[0]["lr"]

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume: model, optimizer, scheduler and scaler under the keys of
        :mod:`toolkit.utils.checkpoint`."""

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{key: shape}`` of the unwrapped model's ``state_dict``: what a checkpoint must hold to load."""
        return {key: tuple(value.shape) for key, value in self.module.state_dict(keep_vars=True).items()}

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; optimizer/scheduler entries are optional."""

    def save(self, path: str, info: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Collective save: EVERY rank calls it. Global rank 0 writes ``path`` (``.pt``, with ``extra`` under
        ``EXTRA_KEY`` when given) and its ``.yaml`` atomically; a barrier ends it, so no rank runs ahead of a
        checkpoint that is not on disk yet."""
        check_collective("save_model")

        def write() -> None:
            state = self.state_dict()
            if extra is not None:
                state[EXTRA_KEY] = extra
            save_checkpoint(path, state, info)

        run_on_main(write)

    def load(self, path: str) -> dict[str, Any]:
        """Resume from checkpoint ``path`` written by :meth:`save` (every rank calls it). Returns the ``extra``
        entry (``{}`` when absent) for the caller's saver hooks.

        Raises:
            FileNotFoundError: ``path`` or its committed ``.yaml`` is missing.
            ConfigError: ``path`` keeps its optimizer state in a shard directory (torch_fsdp's sharded checkpoints,
                which only that engine reads), is not a readable checkpoint, or holds a model of another shape
                (:func:`~toolkit.utils.checkpoint.load_checkpoint`, :func:`~toolkit.utils.checkpoint.check_model_state`).
        """
        state = load_checkpoint(path)
        if OPTIMIZER_SHARDS_KEY in state:  # NOTE: resuming without it would restart Adam's moments silently
            raise ConfigError(f"cannot resume {path}: its optimizer state is in the shard directory "
                              f"{state[OPTIMIZER_SHARDS_KEY]}/ beside it (torch_fsdp, fsdp_state_dict_type sharded); "
                              "resume it with --train_engine torch_fsdp and that directory in place")
        check_model_state(self.model_shapes(), state[MODEL_KEY], path)
        self.load_state_dict(state)
        return state.get(EXTRA_KEY, {})
