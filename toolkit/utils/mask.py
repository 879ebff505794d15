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


def subsequent_chunk_mask(size: int, chunk_size: int, num_left_chunks: int = -1,
                          device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """Chunk-wise self-attention mask of a streaming encoder (U2, Zhang et al., 2020, arXiv:2012.05481): frames are
    cut into chunks of ``chunk_size``; a frame sees every frame of its own chunk and of the ``num_left_chunks``
    chunks before it (all earlier chunks for a negative value), none after its chunk.

    Args:
        size: frames T.
        chunk_size: frames per chunk, > 0.
        num_left_chunks: earlier chunks seen; < 0: all.

    Returns:
        bool (T, T), entry [i, j] True iff frame i attends to frame j.

    Example: size 4, chunk_size 2 -> [[T, T, F, F], [T, T, F, F], [T, T, T, T], [T, T, T, T]].
    """
    chunk = torch.arange(size, device=device) // chunk_size
    query, key = chunk.unsqueeze(1), chunk.unsqueeze(0)
    mask = key <= query
    if num_left_chunks >= 0:
        mask &= key >= query - num_left_chunks
    return mask


def draw_dynamic_chunk(max_len: int, use_dynamic_left_chunk: bool, max_chunk_size: int) -> tuple[int, int]:
    """The chunk of one training batch under dynamic chunk training (U2, arXiv:2012.05481, section 2.3; WeNet's
    draw), from torch's global generator: c uniform in 1 .. max_len - 1; c > max_len // 2 (about half of the
    batches) is full context, otherwise the chunk is c % max_chunk_size + 1 frames, with, when
    ``use_dynamic_left_chunk``, a uniform number of left chunks in 0 .. (max_len - 1) // chunk - 1 (else all).

    Args:
        max_len: encoder frames T' of the batch.
        use_dynamic_left_chunk: draw the left chunks too.
        max_chunk_size: the largest chunk, in encoder frames.

    Returns:
        (chunk_size, num_left_chunks): ``max_len`` and -1 for full context (also for max_len <= 1).
    """
    if max_len <= 1:
        return max_len, -1
    chunk = int(torch.randint(1, max_len, (1,)).item())
    if chunk > max_len // 2:
        return max_len, -1
    chunk = chunk % max_chunk_size + 1
    max_left_chunks = (max_len - 1) // chunk
    if use_dynamic_left_chunk and max_left_chunks > 0:
        return chunk, int(torch.randint(0, max_left_chunks, (1,)).item())
    return chunk, -1
