"""Tensorboard writer for the main process only (other ranks get ``None`` and log nothing)."""

from __future__ import annotations

import os


def init_summarywriter(tensorboard_dir: str | None, model_dir: str, is_main: bool):
    """A ``SummaryWriter`` writing to ``tensorboard_dir/<basename of model_dir>`` on global rank 0, else ``None``."""
    if not is_main or not tensorboard_dir:
        return None
    from torch.utils.tensorboard import SummaryWriter

    path = os.path.join(tensorboard_dir, os.path.basename(os.path.normpath(model_dir)))
    os.makedirs(path, exist_ok=True)
    return SummaryWriter(path)
