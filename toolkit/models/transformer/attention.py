"""Multi-head attention (Vaswani et al., 2017, arXiv:1706.03762) and its relative-position
variant from Transformer-XL (Dai et al., 2019, arXiv:1901.02860) as used in Conformer
(Gulati et al., 2020, arXiv:2005.08100).

Masks are boolean and True where a key takes part: (B, 1, T2) for padding only, or (B, T1, T2)
when queries see different keys (causal decoding).
"""
import math
from typing import Optional

import torch
from torch import nn

from toolkit.models.transformer.dropout import Dropout


class MultiHeadedAttention(nn.Module):
    """Scaled dot-product attention over ``n_head`` heads.

    Args:
        n_head: number of heads H.
        n_feat: model size D, split into H heads of D / H.
        dropout_rate: dropout on the attention weights.

    Raises:
        ValueError: ``n_feat`` is not divisible by ``n_head``.
    """

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float):
        super().__init__()
        if n_feat % n_head:
            raise ValueError(f"n_feat {n_feat} is not divisible by n_head {n_head}")
        self.d_k = n_feat // n_head
        self.h = n_head
        self.scale = 1.0 / math.sqrt(self.d_k)
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.dropout = Dropout(p=dropout_rate)
        # Set by toolkit.export while torch.onnx traces the model: the same values by ops its exporter can convert
        # (a plain attribute, not torch.compiler.is_exporting(), which TorchScript cannot compile).
        self.for_export = False

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """float32 (B, T, D) -> (B, H, T, D / H)."""
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(D/H) + bias) v over the keys ``mask`` lets take part, then the output projection,
        through ``scaled_dot_product_attention`` (a fused kernel where PyTorch has one for these inputs).

        Args:
            query: float32 (B, H, T1, D / H).
            key, value: float32 (B, H, T2, D / H).
            mask: bool (B, 1, T2) or (B, T1, T2), True where a key takes part.
            bias: float32 (B, H, T1, T2) added to the scaled scores (relative positions), or None.

        Returns:
            float32 (B, T1, D). A query with no valid key (a zero-length sequence) attends to nothing:
            PyTorch gives such a row zero weights (its safe softmax, also in the fused CPU kernel), so it gets
            zeros before the output projection, never NaN.
        """
        attn_mask = mask.unsqueeze(1)  # (B, 1, 1 or T1, T2)
        if bias is not None:
            attn_mask = bias.masked_fill(~attn_mask, float("-inf"))
        dropout_p = self.dropout.p if self.training else 0.0
        x = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                       scale=self.scale)
        if self.for_export:
            # NOTE: torch.onnx's dynamo exporter (torch 2.13) turns the reshape below into a view it then refuses
            # ("Cannot view a tensor ... with strides ... Max(1, T)"); the heads side by side are the same values.
            x = torch.cat(x.unbind(1), dim=-1)  # (B, T1, D)
        else:
            x = x.transpose(1, 2).reshape(x.size(0), -1, self.h * self.d_k)  # (B, T1, D)
        return self.linear_out(x)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: float32 (B, T1, D).
            key, value: float32 (B, T2, D).
            mask: bool (B, 1, T2) or (B, T1, T2), True where a key takes part.
            pos_emb: the positional embedding of :meth:`attend_heads` (ignored here).

        Returns:
            float32 (B, T1, D).
        """
        q = self.split_heads(self.linear_q(query))
        k = self.split_heads(self.linear_k(key))
        v = self.split_heads(self.linear_v(value))
        return self.attend_heads(q, k, v, mask, pos_emb)

    def self_attend(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor,
                    cache: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """An encoder layer's self-attention over ``x``: the whole input (``cache`` None; no new cache), or a chunk
        of a stream with the cache of the frames before it (:meth:`forward_chunk`, its new cache too)."""
        if cache is None:
            return self.forward(x, x, x, mask, pos_emb), None
        return self.forward_chunk(x, mask, pos_emb, cache)

    def forward_chunk(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor, cache: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Self-attention of a chunk of a stream over the keys and values of the frames before it (``cache``)
        and its own, which are not recomputed.

        Args:
            x: float32 (B, C, D), the chunk.
            mask: bool (B, C, S + C), True where a key takes part, or (0, 0, 0): every key.
            pos_emb: as :meth:`attend_heads` for C queries and S + C keys.
            cache: float32 (B, H, S, 2 D / H), each head's keys then values of the S frames before the chunk
                (S = 0: none).

        Returns:
            float32 (B, C, D), and the new cache (B, H, S + C, 2 D / H), the cache with the chunk's appended.
        """
        q = self.split_heads(self.linear_q(x))
        k = self.split_heads(self.linear_k(x))
        v = self.split_heads(self.linear_v(x))
        if cache.size(2) > 0:
            cached_k, cached_v = cache.split(self.d_k, dim=-1)
            k, v = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)  # (B, H, S + C, D / H)
        if mask.size(0) == 0:
            mask = torch.ones(x.size(0), 1, k.size(2), dtype=torch.bool, device=x.device)
        return self.attend_heads(q, k, v, mask, pos_emb), torch.cat([k, v], dim=-1)

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     pos_emb: torch.Tensor) -> torch.Tensor:
        """:meth:`attend` on the heads' queries (B, H, T1, D / H), keys and values (B, H, T2, D / H); the
        relative-position subclass adds its position term from ``pos_emb``."""
        return self.attend(q, k, v, mask)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Turn scores against relative distances into scores against key positions.

    Args:
        x: float32 (B, H, T1, T1 + T2 - 1) for T1 queries that are the last of T2 >= T1 keys; column k holds
            distance T2 - 1 - k (as ordered by RelPositionalEncoding), from T2 - 1 down to -(T1 - 1).

    Returns:
        float32 (B, H, T1, T2) with out[..., i, j] = x[..., i, T1 - 1 - i + j], i.e. the score for distance
        (T2 - T1 + i) - j between query i and key j.
    """
    x = x.contiguous()
    batch, heads, time, width = x.size()
    # Row i of the (time, width) block starts i * width + (time - 1 - i) elements into it, so
    # rows are width - 1 apart and never overlap; a strided view avoids any copy.
    # NOTE: the view's offset comes from slicing, not from x.storage_offset(), which torch.compile
    # cannot trace (a graph break in every layer; train_conf.compile); unfold would fix T.
    row0 = x.view(batch, heads, time * width)[:, :, time - 1:]  # storage offset at out[..., 0, 0]
    return row0.as_strided((batch, heads, time, width - time + 1), (x.stride(0), x.stride(1), width - 1, 1))


def rel_shift_by_padding(x: torch.Tensor) -> torch.Tensor:
    """:func:`rel_shift` by Transformer-XL's padding trick (a zero column on the left, the rows read one further
    along; Dai et al., 2019, arXiv:1901.02860, appendix B), for an exported graph: ONNX has no strided view, and
    torch.onnx turns ``as_strided`` into a gather whose indices hold for the traced shape only. One copy of x."""
    batch, heads, time, width = x.size()
    padded = nn.functional.pad(x, (1, 0))  # (B, H, T1, W + 1)
    shifted = padded.view(batch, heads, width + 1, time)[:, :, 1:].reshape(batch, heads, time, width)
    return shifted[..., :width - time + 1]  # (B, H, T1, T2)


class RelPositionMultiHeadedAttention(MultiHeadedAttention):
    """Self-attention with relative positional encoding and learned biases ``pos_bias_u`` (content)
    and ``pos_bias_v`` (position), following Transformer-XL section 3.3:
    score(i, j) = (q_i + u) k_j + (q_i + v) W_pos r_{i-j}.

    Args:
        n_head, n_feat, dropout_rate: as :class:`MultiHeadedAttention`.

    Raises:
        ValueError: ``n_feat`` is not divisible by ``n_head``.
    """

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float):
        super().__init__(n_head, n_feat, dropout_rate)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     pos_emb: torch.Tensor) -> torch.Tensor:
        """Attention with relative positions (self-attention only: the T1 queries are the last T1 of the keys).

        Args:
            q: float32 (B, H, T1, D / H); k, v: float32 (B, H, T2, D / H), T2 >= T1.
            mask: bool (B, 1, T2) or (B, T1, T2), True where a key takes part.
            pos_emb: float32 (1, T1 + T2 - 1, D) from RelPositionalEncoding (the distances T2 - 1 .. -(T1 - 1)).

        Returns:
            float32 (B, T1, D).
        """
        p = self.split_heads(self.linear_pos(pos_emb))  # (1, H, T1 + T2 - 1, D / H)
        q_u = q + self.pos_bias_u.unsqueeze(1)
        q_v = q + self.pos_bias_v.unsqueeze(1)
        # The content term (q + u) k^T is the attention's own product; the position term is its additive bias.
        scores = torch.matmul(q_v, p.transpose(-2, -1))  # (B, H, T1, T1 + T2 - 1)
        matrix_bd = rel_shift_by_padding(scores) if self.for_export else rel_shift(scores)  # (B, H, T1, T2)
        return self.attend(q_u, k, v, mask, matrix_bd * self.scale)
