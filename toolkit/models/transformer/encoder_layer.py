"""Encoder blocks: Transformer (Vaswani et al., 2017, arXiv:1706.03762) and Conformer
(Gulati et al., 2020, arXiv:2005.08100, section 2.4, equation 1)."""
from typing import Optional

import torch
from torch import nn

from toolkit.models.transformer.convolution import ConvolutionModule
from toolkit.models.transformer.dropout import Dropout
from toolkit.models.transformer.positionwise_feed_forward import PositionwiseFeedForward


class TransformerEncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual branch with LayerNorm.

    Args:
        size: model size D.
        self_attn: MultiHeadedAttention or RelPositionMultiHeadedAttention.
        feed_forward: PositionwiseFeedForward.
        dropout_rate: dropout on each branch output before the residual addition.
        normalize_before: pre-norm (True, more stable) or post-norm (the original paper).
    """

    def __init__(self, size: int, self_attn: nn.Module, feed_forward: PositionwiseFeedForward,
                 dropout_rate: float, normalize_before: bool = True):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.norm1 = nn.LayerNorm(size, eps=1e-12)
        self.norm2 = nn.LayerNorm(size, eps=1e-12)
        self.dropout = Dropout(dropout_rate)
        self.normalize_before = normalize_before

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor, mask_pad: torch.Tensor,
                att_cache: Optional[torch.Tensor] = None, cnn_cache: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Args:
            x: float32 (B, T, D); in streaming, a chunk of T = C frames after the S frames ``att_cache`` holds.
            mask: bool (B, 1 or T, S + T), True where a key takes part; in streaming (0, 0, 0) is every key.
            pos_emb: float32 positional embedding for the attention (ignored by the absolute one).
            mask_pad: bool (B, 1, T), True at valid frames (unused; shared layer signature).
            att_cache: None for a whole utterance; in streaming float32 (B, H, S, 2 D / H) (see
                :meth:`~toolkit.models.transformer.attention.MultiHeadedAttention.forward_chunk`).
            cnn_cache: unused, returned as is (shared layer signature; no convolution here).

        Returns:
            float32 (B, T, D); the new attention cache (B, H, S + T, 2 D / H) in streaming (None without
            ``att_cache``); ``cnn_cache``.
        """
        residual = x
        if self.normalize_before:
            x = self.norm1(x)
        attended, new_att_cache = self.self_attn.self_attend(x, mask, pos_emb, att_cache)
        x = residual + self.dropout(attended)
        if not self.normalize_before:
            x = self.norm1(x)
        residual = x
        if self.normalize_before:
            x = self.norm2(x)
        x = residual + self.dropout(self.feed_forward(x))
        if not self.normalize_before:
            x = self.norm2(x)
        return x, new_att_cache, cnn_cache


class ConformerEncoderLayer(nn.Module):
    """Conformer block: 1/2 FFN (macaron), MHSA, convolution module, 1/2 FFN, final LayerNorm.

    Args:
        size: model size D.
        self_attn: attention module (RelPositionMultiHeadedAttention in the paper).
        feed_forward: the second (or only) feed-forward module.
        feed_forward_macaron: the first feed-forward module, or None for a single full-step FFN.
        conv_module: ConvolutionModule, or None to drop the convolution branch.
        dropout_rate: dropout on each branch output before the residual addition.
        normalize_before: pre-norm per branch (the paper) or post-norm.
    """

    def __init__(self, size: int, self_attn: nn.Module, feed_forward: PositionwiseFeedForward,
                 feed_forward_macaron: Optional[PositionwiseFeedForward],
                 conv_module: Optional[ConvolutionModule], dropout_rate: float,
                 normalize_before: bool = True):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.feed_forward_macaron = feed_forward_macaron
        self.conv_module = conv_module
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)
        # Norms of absent branches are not created: parameters that never get a gradient break
        # DistributedDataParallel without find_unused_parameters.
        self.norm_ff_macaron = (nn.LayerNorm(size, eps=1e-12)
                                if feed_forward_macaron is not None else None)
        self.norm_conv = nn.LayerNorm(size, eps=1e-12) if conv_module is not None else None
        self.norm_final = nn.LayerNorm(size, eps=1e-12)
        # Macaron-Net halves each FFN step so the two FFNs together make one full step.
        self.ff_scale = 0.5 if feed_forward_macaron is not None else 1.0
        self.dropout = Dropout(dropout_rate)
        self.normalize_before = normalize_before

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor, mask_pad: torch.Tensor,
                att_cache: Optional[torch.Tensor] = None, cnn_cache: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Args:
            x: float32 (B, T, D); in streaming, a chunk of T = C frames after the S frames ``att_cache`` holds.
            mask: bool (B, 1 or T, S + T), True where a key takes part; in streaming (0, 0, 0) is every key.
            pos_emb: float32 (1, S + 2T - 1, D) relative or (1, T, D) absolute positional embedding.
            mask_pad: bool (B, 1, T), True at valid frames (for the convolution module).
            att_cache: None for a whole utterance; in streaming float32 (B, H, S, 2 D / H) (see
                :meth:`~toolkit.models.transformer.attention.MultiHeadedAttention.forward_chunk`).
            cnn_cache: None for a whole utterance; in streaming float32 (B, D, kernel_size - 1) or (0, 0, 0) (see
                :meth:`~toolkit.models.transformer.convolution.ConvolutionModule.forward_chunk`).

        Returns:
            float32 (B, T, D); in streaming the new attention cache (B, H, S + T, 2 D / H) and the new convolution
            cache ((B, D, kernel_size - 1) for a causal convolution module, else ``cnn_cache``); None and
            ``cnn_cache`` for a whole utterance.
        """
        # NOTE: the whole-utterance path calls the modules as before streaming existed: with the chunk path in a
        # method of its own, the compiled layer (train_conf.compile) drew other dropout masks than eager.
        if self.feed_forward_macaron is not None and self.norm_ff_macaron is not None:
            residual = x
            if self.normalize_before:
                x = self.norm_ff_macaron(x)
            x = residual + self.ff_scale * self.dropout(self.feed_forward_macaron(x))
            if not self.normalize_before:
                x = self.norm_ff_macaron(x)

        residual = x
        if self.normalize_before:
            x = self.norm_mha(x)
        attended, new_att_cache = self.self_attn.self_attend(x, mask, pos_emb, att_cache)
        x = residual + self.dropout(attended)
        if not self.normalize_before:
            x = self.norm_mha(x)

        new_cnn_cache = cnn_cache
        if self.conv_module is not None and self.norm_conv is not None:
            residual = x
            if self.normalize_before:
                x = self.norm_conv(x)
            if cnn_cache is None:
                convolved = self.conv_module(x, mask_pad)
            else:
                convolved, new_cnn_cache = self.conv_module.forward_chunk(x, mask_pad, cnn_cache)
            x = residual + self.dropout(convolved)
            if not self.normalize_before:
                x = self.norm_conv(x)

        residual = x
        if self.normalize_before:
            x = self.norm_ff(x)
        x = residual + self.ff_scale * self.dropout(self.feed_forward(x))
        if not self.normalize_before:
            x = self.norm_ff(x)
        return self.norm_final(x), new_att_cache, new_cnn_cache
