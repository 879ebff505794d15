"""Transformer decoder block (Vaswani et al., 2017, arXiv:1706.03762, section 3.1)."""
from typing import Optional

import torch
from torch import nn

from toolkit.models.transformer.attention import MultiHeadedAttention
from toolkit.models.transformer.dropout import Dropout
from toolkit.models.transformer.positionwise_feed_forward import PositionwiseFeedForward


class DecoderLayer(nn.Module):
    """Causal self-attention, attention over the encoder output (src-attention), feed-forward;
    each in a residual branch with LayerNorm.

    Args:
        size: model size D.
        self_attn: MultiHeadedAttention over the previous tokens.
        src_attn: MultiHeadedAttention over the encoder output.
        feed_forward: PositionwiseFeedForward.
        dropout_rate: dropout on each branch output before the residual addition.
        normalize_before: pre-norm (True) or post-norm.
    """

    def __init__(self, size: int, self_attn: MultiHeadedAttention,
                 src_attn: MultiHeadedAttention, feed_forward: PositionwiseFeedForward,
                 dropout_rate: float, normalize_before: bool = True):
        super().__init__()
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.norm1 = nn.LayerNorm(size, eps=1e-12)
        self.norm2 = nn.LayerNorm(size, eps=1e-12)
        self.norm3 = nn.LayerNorm(size, eps=1e-12)
        self.dropout = Dropout(dropout_rate)
        self.normalize_before = normalize_before

    def forward(self, tgt: torch.Tensor, tgt_mask: torch.Tensor, memory: torch.Tensor,
                memory_mask: torch.Tensor, cache: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Args:
            tgt: float32 (B, L, D) input token states.
            tgt_mask: bool (B, L, L), True where step i may attend to step j (causal & non-pad).
            memory: float32 (B, T', D) encoder output.
            memory_mask: bool (B, 1, T'), True at valid encoder frames.
            cache: float32 (B, L-1, D) this layer's outputs for the first L-1 steps, or None.
                When given, only step L is computed (incremental decoding).

        Returns:
            float32 (B, L, D).
        """
        residual = tgt
        if self.normalize_before:
            tgt = self.norm1(tgt)
        query = tgt
        if cache is not None:
            query = tgt[:, -1:]
            residual = residual[:, -1:]
            tgt_mask = tgt_mask[:, -1:]
        empty = torch.empty(0, device=tgt.device)
        x = residual + self.dropout(self.self_attn(query, tgt, tgt, tgt_mask, empty))
        if not self.normalize_before:
            x = self.norm1(x)

        residual = x
        if self.normalize_before:
            x = self.norm2(x)
        x = residual + self.dropout(self.src_attn(x, memory, memory, memory_mask, empty))
        if not self.normalize_before:
            x = self.norm2(x)

        residual = x
        if self.normalize_before:
            x = self.norm3(x)
        x = residual + self.dropout(self.feed_forward(x))
        if not self.normalize_before:
            x = self.norm3(x)

        if cache is not None:
            x = torch.cat([cache, x], dim=1)
        return x
