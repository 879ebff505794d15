"""The tensorboard writer of a training run (the trainer makes it on the main process only)."""

from __future__ import annotations

import os


def init_summarywriter(tensorboard_dir: str | None, model_dir: str, purge_step: int = 1):
    """A ``SummaryWriter`` writing to ``tensorboard_dir/<basename of model_dir>``, or None without a
    ``tensorboard_dir``.

    ``purge_step`` is the first optimizer step this run will log (the resumed checkpoint's step + 1; 1 for a fresh
    run). TensorBoard then hides every earlier event at or after that step, whatever its tag, so a run resumed from
    an older checkpoint into the same directory (or a fresh run into a used one) shows one value per step instead of
    the abandoned run's points beside the new ones (``SummaryWriter(purge_step=...)``: a ``SessionLog.START`` event
    that TensorBoard's reader honours). That is why every scalar of the trainer, also the per-epoch ``cv/loss``, is
    keyed by the optimizer step (see :meth:`toolkit.engine.executor.Executor.epoch_info`).
    """
    if not tensorboard_dir:
        return None
    from torch.utils.tensorboard import SummaryWriter

    path = os.path.join(tensorboard_dir, os.path.basename(os.path.normpath(model_dir)))
    os.makedirs(path, exist_ok=True)
    return SummaryWriter(path, purge_step=purge_step)
