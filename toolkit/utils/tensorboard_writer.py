"""The tensorboard writer of a training run (the trainer makes it on the main process only)."""

from __future__ import annotations

import os


def run_log_dir(tensorboard_dir: str, model_dir: str) -> str:
    """The folder of ``model_dir``'s curves under ``tensorboard_dir``: the model dir's path relative to the folder
    holding ``tensorboard_dir`` (the recipe's ``exp/char/conformer`` logs to ``tensorboard/exp/char/conformer``), or,
    for a model dir outside that folder, its absolute path under ``tensorboard_dir/abs/``. Derived from the whole
    path (symlinks resolved), so two model dirs never share a folder, and so never purge each other's points
    (``exp/char/conformer`` and ``exp/bpe/conformer``, or ``exp/conformer`` of two recipes logging to one absolute
    ``tensorboard_dir``), while a resume into the same model dir finds its own."""
    model_dir, base = os.path.realpath(model_dir), os.path.dirname(os.path.realpath(tensorboard_dir))
    relative = os.path.relpath(model_dir, base)
    if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
        relative = os.path.join("abs", model_dir.lstrip(os.sep))
    return os.path.join(tensorboard_dir, relative)


def init_summarywriter(tensorboard_dir: str | None, model_dir: str, purge_step: int = 1):
    """A ``SummaryWriter`` writing to :func:`run_log_dir` (``tensorboard_dir/<model_dir's path>``), or None without a
    ``tensorboard_dir``.

    ``purge_step`` is the first optimizer step this run will log (the resumed checkpoint's step + 1; 1 for a fresh
    run). TensorBoard then hides every earlier event at or after that step, whatever its tag, so a run resumed from
    an older checkpoint into the same model dir (or a fresh run into a used one) shows one value per step instead of
    the abandoned run's points beside the new ones (``SummaryWriter(purge_step=...)``: a ``SessionLog.START`` event
    that TensorBoard's reader honours). That is why every scalar of the trainer, also the per-epoch ``cv/loss``, is
    keyed by the optimizer step (see :meth:`toolkit.engine.executor.Executor.epoch_info`). Other model dirs' folders
    are never touched.
    """
    if not tensorboard_dir:
        return None
    from torch.utils.tensorboard import SummaryWriter

    path = run_log_dir(tensorboard_dir, model_dir)
    os.makedirs(path, exist_ok=True)
    return SummaryWriter(path, purge_step=purge_step)
