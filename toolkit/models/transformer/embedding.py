"""Sinusoidal positional encodings (Vaswani et al., 2017, arXiv:1706.03762, section 3.5).

Both modules scale the input by sqrt(d_model) and return ``(x, pos_emb)`` so that encoder layers
can use either one through the same interface.
"""
import math

import torch
from torch import nn

from toolkit.models.transformer.dropout import Dropout


def _sinusoid_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """float32 (P, d_model) table: sin on even dims, cos on odd dims, for the given positions.

    Raises:
        ValueError: ``d_model`` is odd.
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    angles = positions.float().unsqueeze(1) * div_term
    table = torch.zeros(positions.size(0), d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


class PositionalEncoding(nn.Module):
    """Absolute positional encoding added to the scaled input.

    Args:
        d_model: feature size D (even).
        dropout_rate: dropout applied after the addition.
        max_len: longest sequence supported, in (subsampled) frames or tokens.

    Raises:
        ValueError: ``d_model`` is odd.
    """

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000):
        super().__init__()
        self.xscale = math.sqrt(d_model)
        self.dropout = Dropout(p=dropout_rate)
        # Not persistent: it is a pure function of the constructor arguments.
        self.register_buffer("pe", _sinusoid_table(torch.arange(max_len), d_model).unsqueeze(0),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: float32 (B, T, D) -> (x * sqrt(D) + PE, pos_emb (1, T, D)).

        Raises:
            RuntimeError: T exceeds ``max_len`` (shape mismatch in the addition).
        """
        # NOTE: the table in x's dtype: with bf16 weights (DeepSpeed bf16) a float32 sum would meet a bf16
        # LayerNorm next, which the CPU refuses ("mixed dtype").
        pos_emb = self.pe[:, : x.size(1)].to(x.dtype)
        x = x * self.xscale + pos_emb
        return self.dropout(x), self.dropout(pos_emb)


class RelPositionalEncoding(nn.Module):
    """Relative positional encoding for Transformer-XL style attention (Dai et al., 2019,
    arXiv:1901.02860; used by Conformer, arXiv:2005.08100).

    The input is only scaled; the returned ``pos_emb`` encodes the relative distances
    ``T-1, T-2, ..., 0, ..., -(T-1)`` (in this order) consumed by
    :class:`~toolkit.models.transformer.attention.RelPositionMultiHeadedAttention`.

    Args:
        d_model: feature size D (even).
        dropout_rate: dropout on the scaled input and on ``pos_emb``.
        max_len: longest sequence supported, in subsampled frames.

    Raises:
        ValueError: ``d_model`` is odd.
    """

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000):
        super().__init__()
        self.xscale = math.sqrt(d_model)
        self.max_len = max_len
        self.dropout = Dropout(p=dropout_rate)
        distances = torch.arange(max_len - 1, -max_len, -1)
        self.register_buffer("pe", _sinusoid_table(distances, d_model).unsqueeze(0),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: float32 (B, T, D) -> (x * sqrt(D), pos_emb (1, 2T-1, D)).

        Raises:
            RuntimeError: T exceeds ``max_len``.
        """
        time = x.size(1)
        if time > self.max_len:
            raise RuntimeError(f"sequence of {time} frames exceeds max_len {self.max_len}")
        center = self.max_len - 1
        pos_emb = self.pe[:, center - time + 1: center + time].to(x.dtype)  # see PositionalEncoding
        return self.dropout(x * self.xscale), self.dropout(pos_emb)
