"""The process's random number generators as one saveable object, for exact resume.

Dropout, SpecAugment masks drawn in the trainer, and any other draw from a global generator depend on where each
generator stands. :class:`RngState` captures and restores Python's ``random``, NumPy's legacy global generator and
torch's CPU generator, plus every CUDA device's generator when CUDA is available. Each rank has its own states, so
the checkpointer stores it per rank (``main_process_only=False``).

Not covered, on purpose: generators owned by objects (a ``torch.Generator`` given to a DataLoader, a
``random.Random`` inside the dataset), which are re-seeded from the epoch and replayed instead.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_global_rngs(seed: int) -> None:
    """Seed Python's ``random``, NumPy's legacy global generator and torch's (CPU and every CUDA device) with
    ``seed``, so that two runs of one config start from the same states of everything :class:`RngState` saves (an
    unseeded one starts from the OS's entropy, and two otherwise identical runs then differ in their checkpoints)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class RngState:
    """Saver hook for the global RNGs of this process (``state_dict``/``load_state_dict`` like a module)."""

    def state_dict(self) -> dict[str, Any]:
        """``{"python": tuple, "numpy": tuple, "torch": ByteTensor, "cuda": [ByteTensor per device]}``."""
        state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the generators from :meth:`state_dict`.

        Raises:
            ValueError: the state has CUDA generators but this process sees a different number of devices.
        """
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            if len(state["cuda"]) != torch.cuda.device_count():
                raise ValueError(f"checkpoint holds {len(state['cuda'])} CUDA RNG states, this process sees "
                                 f"{torch.cuda.device_count()} devices")
            torch.cuda.set_rng_state_all(state["cuda"])
