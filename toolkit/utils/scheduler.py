"""Learning-rate schedules, each peaking at the optimizer's configured ``lr`` after a linear warm-up.

``warmuplr`` (:class:`WarmupLR`) is the Noam schedule of "Attention Is All You Need" (arXiv:1706.03762, eq. 3):
after ``warmup_steps`` optimizer steps it decays with the inverse square root of the step, without end.
``warmupcosinelr`` (:class:`WarmupCosineLR`) anneals to ``final_lr_ratio`` x ``lr`` along half a cosine that ends
at the run's last step (SGDR, arXiv:1608.03983, eq. 5, one cycle without restarts): for a run of known length
(Li et al., "Budgeted training", arXiv:1905.04753: a schedule that decays to the end of the budget beats one that
does not).
"""

from __future__ import annotations

import inspect
import logging
import math

import torch

from toolkit.utils.config_parsing import ConfigError

OPTIMIZER_CHOICES = ("adam", "adamw")


class WarmupLR(torch.optim.lr_scheduler.LRScheduler):
    """``lr(step) = base_lr * warmup**0.5 * min(step**-0.5, step * warmup**-1.5)`` with ``step`` counted from 1.

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak, reached at ``step == warmup_steps``.
        warmup_steps: optimizer steps (not batches: with ``accum_grad`` > 1 one step spans several batches).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 25000, last_epoch: int = -1):
        _check_steps("warmup_steps", warmup_steps)
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        step = self.last_epoch + 1
        scale = self.warmup_steps**0.5 * min(step**-0.5, step * self.warmup_steps**-1.5)
        return [base_lr * scale for base_lr in self.base_lrs]


class WarmupCosineLR(torch.optim.lr_scheduler.LRScheduler):
    """``lr(step) = base_lr * step / warmup_steps`` up to ``warmup_steps``, then
    ``base_lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)`` with ``p = (step - warmup_steps) / (max_steps -
    warmup_steps)`` clipped to 1 and ``r = final_lr_ratio``; ``step`` counted from 1.

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak, reached at ``step == warmup_steps``.
        warmup_steps: optimizer steps of the linear warm-up.
        max_steps: the run's optimizer steps; from it on the LR stays at ``final_lr_ratio * lr``. The trainer fills
            it from the planned batches (``train_conf.max_epoch`` x the steps of an epoch) when the config omits it.
        final_lr_ratio: the LR at ``max_steps`` as a fraction of the peak, in [0, 1].

    Raises:
        ValueError: ``warmup_steps`` or ``max_steps`` not an integer >= 1, ``final_lr_ratio`` not a number in
            [0, 1].

    The shape (``warmup_steps``, ``max_steps``, ``final_lr_ratio``) is the config's, not the checkpoint's: a run
    resumed with a larger ``max_epoch`` stretches its remaining decay to the new end, from its first step on.
    """

    SHAPE = ("warmup_steps", "max_steps", "final_lr_ratio")

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 500, max_steps: int = 0,
                 final_lr_ratio: float = 0.0, last_epoch: int = -1):
        _check_steps("warmup_steps", warmup_steps)
        _check_steps("max_steps", max_steps)
        if isinstance(final_lr_ratio, bool) or not isinstance(final_lr_ratio, (int, float)) or not (
                0.0 <= final_lr_ratio <= 1.0):
            raise ValueError(f"final_lr_ratio must be a number in [0, 1], got {final_lr_ratio!r}")
        self.warmup_steps, self.max_steps, self.final_lr_ratio = warmup_steps, max_steps, final_lr_ratio
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        step = self.last_epoch + 1
        if step < self.warmup_steps:  # a run shorter than its warm-up (a smoke test) never decays
            scale = step / self.warmup_steps
        else:
            progress = min(1.0, (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps))
            scale = self.final_lr_ratio + (1 - self.final_lr_ratio) * (1 + math.cos(math.pi * progress)) / 2
        return [base_lr * scale for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        shape = {key: getattr(self, key) for key in self.SHAPE}
        super().load_state_dict(state_dict)
        self.__dict__.update(shape)
        # the next step's LR on this shape (the optimizer's restored LR is the old shape's): with the same shape the
        # same number, so an exact resume stays exact
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


def _check_steps(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


SCHEDULER_CLASSES = {"warmuplr": WarmupLR, "warmupcosinelr": WarmupCosineLR}
SCHEDULER_CHOICES = tuple(SCHEDULER_CLASSES)


def init_optimizer_and_scheduler(
    params, optim: str, optim_conf: dict, scheduler: str, scheduler_conf: dict, max_steps: int | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Build the optimizer and LR scheduler named in the config. The optimizer is torch's fused implementation
    unless ``optim_conf`` sets ``fused`` or ``foreach``. ``max_steps`` (the run's optimizer steps, when the trainer
    knows them in advance) fills ``scheduler_conf.max_steps`` of a schedule that takes it and where the config
    omits it.

    Raises:
        ConfigError: an unknown optimizer or scheduler name, an ``optim_conf``/``scheduler_conf`` key the class
            does not take (the message lists the valid ones), a non-finite number, or a value the class refuses
            (its own message, e.g. a negative learning rate); ``warmupcosinelr`` without ``max_steps`` where the
            trainer cannot count the steps in advance (shards or dynamic batching).
    """
    if optim not in OPTIMIZER_CHOICES:
        raise ConfigError(f"optim: {optim!r} is not one of {list(OPTIMIZER_CHOICES)}")
    if scheduler not in SCHEDULER_CHOICES:
        raise ConfigError(f"scheduler: {scheduler!r} is not one of {list(SCHEDULER_CHOICES)}")
    optim_cls = torch.optim.Adam if optim == "adam" else torch.optim.AdamW
    scheduler_cls = SCHEDULER_CLASSES[scheduler]
    for name, cls, conf in (("optim_conf", optim_cls, optim_conf), ("scheduler_conf", scheduler_cls, scheduler_conf)):
        valid = [p for p in inspect.signature(cls.__init__).parameters
                 if p not in ("self", "params", "optimizer", "last_epoch")]
        unknown = sorted(set(conf) - set(valid))
        if unknown:
            raise ConfigError(f"{name}: unknown keys {unknown}; valid keys: {valid}")
        for key, value in conf.items():
            numbers = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                raise ConfigError(f"{name}.{key} must be finite, got {value!r}")
    if "max_steps" in inspect.signature(scheduler_cls.__init__).parameters and "max_steps" not in scheduler_conf:
        if max_steps is None:
            raise ConfigError(f"scheduler_conf.max_steps: {scheduler} needs the run's optimizer steps, which the "
                              "trainer counts in advance for raw lists with static or bucket batching, not for "
                              "shards or dynamic batching: set it to max_epoch x optimizer steps per epoch (in "
                              "the YAML, or --override_config 'scheduler_conf {max_steps: N}')")
        logging.info("scheduler %s: max_steps %d, counted from the planned batches", scheduler, max_steps)
        scheduler_conf = {**scheduler_conf, "max_steps": max_steps}
    if "fused" not in optim_conf and "foreach" not in optim_conf:
        # NOTE: one fused kernel for every parameter (CPU and GPU) instead of a loop over ~300 tensors: the
        # optimizer's share of a conformer step halves (docs/benchmarks.md); the same update up to rounding.
        optim_conf = {**optim_conf, "fused": True}
    try:
        optimizer = optim_cls(params, **optim_conf)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"optim_conf: {e}") from e
    try:
        return optimizer, scheduler_cls(optimizer, **scheduler_conf)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"scheduler_conf: {e}") from e
