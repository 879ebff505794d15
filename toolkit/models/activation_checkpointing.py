"""Activation checkpointing (Chen et al., 2016, "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174):
a checkpointed layer keeps only its inputs for the backward pass and runs its forward again when the backward
reaches it, trading one more forward of each layer for the memory of its activations.

:func:`checkpointed` is ``torch.utils.checkpoint.checkpoint`` with the settings training needs here:

- ``use_reentrant=False``: the backward runs through the graph built by the first forward (only the tensors it
  saved are recomputed), so every parameter's gradient is accumulated once, at the time it would be without
  checkpointing: DDP's bucket hooks (no ``static_graph`` and no ``find_unused_parameters`` needed) and DeepSpeed's
  ZeRO gradient hooks see the same events; a ZeRO-3 layer's pre-forward hook gathers its parameters again for the
  recomputation. NOTE: the reentrant variant runs a second backward inside the first, which DDP supports only with
  ``static_graph`` (https://pytorch.org/docs/stable/checkpoint.html).
- ``preserve_rng_state=True``: the recomputation draws the dropout masks of the first forward (the RNG state is
  stashed at the forward and restored in a forked RNG), so it recomputes the same values and the global RNG ends
  where it would without checkpointing (exact resume does not depend on the option).
- running statistics: a BatchNorm in training mode updates ``running_mean``/``running_var``/``num_batches_tracked``
  on every forward, so the recomputation would update them a second time (momentum applied twice per step). Those
  buffers are put back to their values before the recomputation once it is done, so the model's state after a step
  is the same as without checkpointing.

Together: the loss, the gradients and the buffers are bit-identical to the run without checkpointing on CPU (the
recomputation executes the same kernels on the same inputs; ``test/toolkit/models/test_activation_checkpointing.py``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpointed"]


def checkpointed(layer: nn.Module, *args):
    """``layer(*args)``, its activations recomputed in the backward pass instead of kept (see the module
    docstring). Call it only where gradients are wanted (training mode, grad enabled) and outside TorchScript."""
    return checkpoint(layer, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (contextlib.nullcontext(), _running_stats_kept(layer)))


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Around the recomputation: the running statistics of ``module``'s norm layers come out as they went in."""
    stats = [buffer for m in module.modules() if getattr(m, "track_running_stats", False)
             for buffer in (m.running_mean, m.running_var, m.num_batches_tracked) if buffer is not None]
    with torch.no_grad():
        saved = [buffer.clone() for buffer in stats]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(stats, saved):
                buffer.copy_(value)
