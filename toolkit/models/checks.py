"""Model checks run once before training: TorchScript compatibility and the parameter count."""

from __future__ import annotations

import logging

from typing import Callable

import torch


def num_parameters(model: torch.nn.Module) -> int:
    """Trainable parameter count."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def check_model(model: torch.nn.Module, log: Callable[..., None] = logging.info) -> int:
    """Script the encoder and decoder with ``torch.jit.script`` (so an export never fails after hours of
    training) and ``log`` the model and its parameter count (a trainer passes a main-process-only logger).

    Returns:
        The number of trainable parameters.

    Raises:
        RuntimeError: a sub-module is not TorchScript-compatible (torch's message names the offending line).
    """
    for name in ("encoder", "decoder"):
        sub = getattr(model, name, None)
        if sub is not None:
            torch.jit.script(sub)
    count = num_parameters(model)
    log("%s", model)
    log("the model has %d trainable parameters (%.2f M)", count, count / 1e6)
    return count
