"""Boolean masks for padded batches and autoregressive decoding.

Convention: :func:`make_pad_mask` is True at padding; every mask handed to attention layers is
"non-pad" style (True where a position takes part), so callers combine masks with ``&``.
"""
import torch


def make_pad_mask(lengths: torch.Tensor, max_len: int = 0) -> torch.Tensor:
    """Mark padded positions of a batch.

    Args:
        lengths: int64 (B,) valid length of each sequence.
        max_len: width T of the mask; 0 means ``lengths.max()``.

    Returns:
        bool (B, T), True at padding (position >= length).

    Example: lengths [3, 1] -> [[F, F, F], [F, T, T]].
    """
    if max_len <= 0:
        max_len = int(lengths.max().item())
    positions = torch.arange(max_len, dtype=lengths.dtype, device=lengths.device)
    return positions.unsqueeze(0) >= lengths.unsqueeze(1)


def make_non_pad_mask(lengths: torch.Tensor, max_len: int = 0) -> torch.Tensor:
    """bool (B, T), True at valid positions; the complement of :func:`make_pad_mask`."""
    return ~make_pad_mask(lengths, max_len)


def subsequent_mask(size: int, device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """Causal mask for self-attention in an autoregressive decoder.

    Returns:
        bool (size, size), lower-triangular: entry [i, j] is True iff j <= i, so step i only
        attends to itself and earlier steps.
    """
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()
