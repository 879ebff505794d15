"""Sinusoidal positional encodings (Vaswani et al., 2017, arXiv:1706.03762, section 3.5).

Both modules scale the input by sqrt(d_model) and return ``(x, pos_emb)`` so that encoder layers
can use either one through the same interface. Neither bounds the length: ``max_len`` positions are computed once,
and an input longer than that gets the further positions computed on demand for that call (by the same formula,
not stored: a module's buffers stay the same on every rank), so a 5-minute utterance encodes like a short one
(NOTE: issue 45, a 216 s test clip stopped the whole decoding at a fixed 5000-frame table).
"""
import math

import torch
from torch import nn

from toolkit.models.transformer.dropout import Dropout


def _check_even(d_model: int) -> None:
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")


def _sinusoid_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """float32 (P, d_model) table on ``positions``' device: sin on even dims, cos on odd dims, for the given
    positions (int64 (P,)); ``d_model`` even. Each row depends on its position alone."""
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)
                         * -(math.log(10000.0) / d_model))
    angles = positions.float().unsqueeze(1) * div_term
    table = torch.zeros(positions.size(0), d_model, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


class PositionalEncoding(nn.Module):
    """Absolute positional encoding added to the scaled input.

    Args:
        d_model: feature size D (even).
        dropout_rate: dropout applied after the addition.
        max_len: positions computed once, in (subsampled) frames or tokens; longer inputs are not refused, their
            further positions are computed on each call (:meth:`positions`).

    Raises:
        ValueError: ``d_model`` is odd.
    """

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000):
        super().__init__()
        _check_even(d_model)
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.dropout = Dropout(p=dropout_rate)
        # Not persistent: it is a pure function of the constructor arguments.
        self.register_buffer("pe", _sinusoid_table(torch.arange(max_len), d_model).unsqueeze(0),
                             persistent=False)

    def positions(self, time: int) -> torch.Tensor:
        """(1, time, D) encoding of positions 0 .. time - 1, in the table's dtype and device: the stored table's
        rows (the same tensor values for the first ``max_len``), then rows computed for the positions past it."""
        table = self.pe
        if time > table.size(1):
            extra = _sinusoid_table(torch.arange(table.size(1), time, device=table.device), self.d_model)
            table = torch.cat([table, extra.to(table.dtype).unsqueeze(0)], dim=1)
        return table[:, :time]

    def forward(self, x: torch.Tensor, offset: int = 0, cached: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """x: float32 (B, T, D), any T, whose first frame is position ``offset`` of the stream (a chunk's, in
        streaming) -> (x * sqrt(D) + PE, pos_emb (1, T, D)), the positions offset .. offset + T - 1. ``cached``
        (the keys before x that attention sees) is for :class:`RelPositionalEncoding`'s signature: unused here."""
        # NOTE: the table in x's dtype: with bf16 weights (DeepSpeed bf16) a float32 sum would meet a bf16
        # LayerNorm next, which the CPU refuses ("mixed dtype").
        pos_emb = self.positions(offset + x.size(1))[:, offset:].to(x.dtype)
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
        max_len: sequence length whose distances are computed once, in subsampled frames; longer inputs are not
            refused, their further distances are computed on each call (:meth:`positions`).

    Raises:
        ValueError: ``d_model`` is odd.
    """

    def __init__(self, d_model: int, dropout_rate: float, max_len: int = 5000):
        super().__init__()
        _check_even(d_model)
        self.d_model = d_model
        self.xscale = math.sqrt(d_model)
        self.max_len = max_len
        self.dropout = Dropout(p=dropout_rate)
        distances = torch.arange(max_len - 1, -max_len, -1)
        self.register_buffer("pe", _sinusoid_table(distances, d_model).unsqueeze(0),
                             persistent=False)

    def positions(self, keys: int, queries: int = -1) -> torch.Tensor:
        """(1, keys + queries - 1, D) encoding of the distances keys - 1 .. -(queries - 1) between ``queries``
        frames and ``keys`` frames of which they are the last (self-attention: queries = keys, the default -1;
        a streamed chunk: keys = cached frames + queries), in the table's dtype and device: the stored table's
        rows where it has them (the same tensor values), rows computed for the distances past +-(max_len - 1)."""
        queries = keys if queries < 0 else queries
        top, center = keys - 1, self.max_len - 1
        bottom = -(queries - 1)
        table = self.pe[:, center - min(top, center):center - max(bottom, -center) + 1]
        device = self.pe.device
        if top > center:
            above = _sinusoid_table(torch.arange(top, center, -1, device=device), self.d_model)
            table = torch.cat([above.to(self.pe.dtype).unsqueeze(0), table], dim=1)
        if bottom < -center:
            below = _sinusoid_table(torch.arange(-self.max_len, bottom - 1, -1, device=device), self.d_model)
            table = torch.cat([table, below.to(self.pe.dtype).unsqueeze(0)], dim=1)
        return table

    def forward(self, x: torch.Tensor, offset: int = 0, cached: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """x: float32 (B, T, D), any T, after ``cached`` earlier frames that attention also sees as keys (the
        streaming cache) -> (x * sqrt(D), pos_emb (1, cached + 2T - 1, D)), the distances cached + T - 1 ..
        -(T - 1). ``offset`` (x's position in the stream) is for :class:`PositionalEncoding`'s signature: relative
        distances do not depend on it."""
        pos_emb = self.positions(cached + x.size(1), x.size(1)).to(x.dtype)  # see PositionalEncoding
        return self.dropout(x * self.xscale), self.dropout(pos_emb)
