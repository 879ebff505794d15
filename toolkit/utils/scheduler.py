"""Learning-rate schedules.

``WarmupLR`` is the Noam schedule of "Attention Is All You Need" (arXiv:1706.03762, eq. 3) rescaled so that the
peak equals the optimizer's configured ``lr``: linear warm-up for ``warmup_steps`` optimizer steps, then decay with
the inverse square root of the step.
"""

from __future__ import annotations

import inspect
import math

import torch

from toolkit.utils.config import ConfigError

SCHEDULER_CHOICES = ("warmuplr",)
OPTIMIZER_CHOICES = ("adam", "adamw")


class WarmupLR(torch.optim.lr_scheduler.LRScheduler):
    """``lr(step) = base_lr * warmup**0.5 * min(step**-0.5, step * warmup**-1.5)`` with ``step`` counted from 1.

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak, reached at ``step == warmup_steps``.
        warmup_steps: optimizer steps (not batches: with ``accum_grad`` > 1 one step spans several batches).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 25000, last_epoch: int = -1):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        step = self.last_epoch + 1
        scale = self.warmup_steps**0.5 * min(step**-0.5, step * self.warmup_steps**-1.5)
        return [base_lr * scale for base_lr in self.base_lrs]


def init_optimizer_and_scheduler(
    params, optim: str, optim_conf: dict, scheduler: str, scheduler_conf: dict
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Build the optimizer and LR scheduler named in the config. The optimizer is torch's fused implementation
    unless ``optim_conf`` sets ``fused`` or ``foreach``.

    Raises:
        ConfigError: an unknown optimizer or scheduler name, an ``optim_conf``/``scheduler_conf`` key the class
            does not take (the message lists the valid ones), a non-finite number, or a value the class refuses
            (its own message, e.g. a negative learning rate).
    """
    if optim not in OPTIMIZER_CHOICES:
        raise ConfigError(f"optim: {optim!r} is not one of {list(OPTIMIZER_CHOICES)}")
    if scheduler not in SCHEDULER_CHOICES:
        raise ConfigError(f"scheduler: {scheduler!r} is not one of {list(SCHEDULER_CHOICES)}")
    optim_cls = torch.optim.Adam if optim == "adam" else torch.optim.AdamW
    for name, cls, conf in (("optim_conf", optim_cls, optim_conf), ("scheduler_conf", WarmupLR, scheduler_conf)):
        valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params", "optimizer")]
        unknown = sorted(set(conf) - set(valid))
        if unknown:
            raise ConfigError(f"{name}: unknown keys {unknown}; valid keys: {valid}")
        for key, value in conf.items():
            numbers = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                raise ConfigError(f"{name}.{key} must be finite, got {value!r}")
    if "fused" not in optim_conf and "foreach" not in optim_conf:
        # NOTE: one fused kernel for every parameter (CPU and GPU) instead of a loop over ~300 tensors: the
        # optimizer's share of a conformer step halves (docs/benchmarks.md); the same update up to rounding.
        optim_conf = {**optim_conf, "fused": True}
    try:
        optimizer = optim_cls(params, **optim_conf)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"optim_conf: {e}") from e
    try:
        return optimizer, WarmupLR(optimizer, **scheduler_conf)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"scheduler_conf: {e}") from e
