"""Attention decoders of the hybrid CTC/attention model (Vaswani et al., 2017, arXiv:1706.03762; Watanabe et al.,
2017, hybrid CTC/attention): left-to-right, and U2++'s bidirectional pair (Wu et al., 2021, arXiv:2106.05642)."""
from typing import Optional

import torch
from torch import nn

from toolkit.models.activation_checkpointing import checkpointed
from toolkit.models.transformer.attention import MultiHeadedAttention
from toolkit.models.transformer.decoder_layer import DecoderLayer
from toolkit.models.transformer.embedding import PositionalEncoding
from toolkit.models.transformer.positionwise_feed_forward import PositionwiseFeedForward
from toolkit.utils.mask import make_pad_mask, subsequent_mask


class TransformerDecoder(nn.Module):
    """Token embedding, absolute positional encoding, N decoder layers, final LayerNorm, output
    linear. Keyword arguments after ``encoder_output_size`` equal the ``decoder_conf`` keys.

    Args:
        vocab_size: V, including ``<blank>``, ``<unk>`` and ``<sos/eos>``.
        encoder_output_size: model size D (the decoder works at the encoder's size).
        attention_heads, linear_units, num_blocks: heads, FFN inner size, number of layers.
        dropout_rate: dropout in the layers; positional_dropout_rate: after positional encoding.
        self_attention_dropout_rate, src_attention_dropout_rate: dropout on attention weights.
        normalize_before: pre-norm layers.
    """

    def __init__(self, vocab_size: int, encoder_output_size: int, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, self_attention_dropout_rate: float = 0.0,
                 src_attention_dropout_rate: float = 0.0, normalize_before: bool = True):
        super().__init__()
        size = encoder_output_size
        self.embed = nn.Embedding(vocab_size, size)
        self.pos_enc = PositionalEncoding(size, positional_dropout_rate)
        self.decoders = nn.ModuleList([
            DecoderLayer(size,
                         MultiHeadedAttention(attention_heads, size, self_attention_dropout_rate),
                         MultiHeadedAttention(attention_heads, size, src_attention_dropout_rate),
                         PositionwiseFeedForward(size, linear_units, dropout_rate, nn.ReLU()),
                         dropout_rate, normalize_before)
            for _ in range(num_blocks)])
        self.normalize_before = normalize_before
        self.after_norm = nn.LayerNorm(size, eps=1e-12) if normalize_before else None
        self.output_layer = nn.Linear(size, vocab_size)
        self.activation_checkpointing = False  # set by ASRModel.set_activation_checkpointing

    def extra_repr(self) -> str:
        return f"activation_checkpointing={self.activation_checkpointing}"

    def forward(self, memory: torch.Tensor, memory_mask: torch.Tensor, ys_in_pad: torch.Tensor,
                ys_in_lens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced pass over whole token sequences.

        Args:
            memory: float32 (B, T', D) encoder output.
            memory_mask: bool (B, 1, T'), True at valid encoder frames.
            ys_in_pad: int64 (B, L) decoder input (``<sos>`` + tokens), padding any valid id.
            ys_in_lens: int64 (B,) valid lengths of ``ys_in_pad``.

        Returns:
            float32 (B, L, V) logits; rows at padded steps are unspecified.
        """
        length = ys_in_pad.size(1)
        tgt_mask = (~make_pad_mask(ys_in_lens, length).unsqueeze(1)
                    & subsequent_mask(length, ys_in_pad.device).unsqueeze(0))
        x, _ = self.pos_enc(self.embed(ys_in_pad))
        for layer in self.decoders:
            # NOTE: TorchScript compiles only the else branch (is_scripting() is a constant there).
            if not torch.jit.is_scripting() and self.activation_checkpointing and self.training \
                    and torch.is_grad_enabled():
                x = checkpointed(layer, x, tgt_mask, memory, memory_mask)
            else:
                x = layer(x, tgt_mask, memory, memory_mask)
        if self.after_norm is not None:
            x = self.after_norm(x)
        return self.output_layer(x)

    @torch.jit.export
    def forward_one_step(self, memory: torch.Tensor, memory_mask: torch.Tensor,
                         tgt: torch.Tensor, cache: Optional[list[torch.Tensor]] = None
                         ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Score the next token for each prefix, reusing per-layer states of earlier steps.

        Args:
            memory: float32 (N, T', D) encoder output.
            memory_mask: bool (N, 1, T'), True at valid encoder frames.
            tgt: int64 (N, L) prefixes starting with ``<sos>`` (no padding).
            cache: per-layer float32 (N, L-1, D) states returned by the previous step, or None
                at the first step (or to recompute everything).

        Returns:
            log_probs: float32 (N, V) log-softmax for step L+1.
            new_cache: per-layer float32 (N, L, D) states for the next call.
        """
        length = tgt.size(1)
        tgt_mask = subsequent_mask(length, tgt.device).unsqueeze(0)
        x, _ = self.pos_enc(self.embed(tgt))
        new_cache: list[torch.Tensor] = []
        for i, layer in enumerate(self.decoders):
            layer_cache: Optional[torch.Tensor] = None
            if cache is not None:
                layer_cache = cache[i]
            x = layer(x, tgt_mask, memory, memory_mask, layer_cache)
            new_cache.append(x)
        last = x[:, -1]
        if self.after_norm is not None:
            last = self.after_norm(last)
        return torch.log_softmax(self.output_layer(last), dim=-1), new_cache


class BiTransformerDecoder(nn.Module):
    """U2++'s bidirectional decoder (Wu et al., 2021, "U2++: Unified Two-pass Bidirectional End-to-end Model for
    Speech Recognition", arXiv:2106.05642): a left-to-right :class:`TransformerDecoder` of ``num_blocks`` layers
    and a right-to-left one of ``r_num_blocks`` layers that reads each token sequence reversed, each with its own
    embedding and output layer, both attending to the same encoder output. Training weighs their losses by
    ``model_conf.reverse_weight``; attention rescoring scores each hypothesis in both directions. The other
    keyword arguments are :class:`TransformerDecoder`'s (the ``decoder_conf`` keys), shared by the two.

    Raises:
        ValueError: ``r_num_blocks`` < 1.
    """

    def __init__(self, vocab_size: int, encoder_output_size: int, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, r_num_blocks: int = 1, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, self_attention_dropout_rate: float = 0.0,
                 src_attention_dropout_rate: float = 0.0, normalize_before: bool = True):
        super().__init__()
        if r_num_blocks < 1:
            raise ValueError(f"r_num_blocks must be >= 1 (the right-to-left decoder's layers), got {r_num_blocks}")

        def stack(blocks: int) -> TransformerDecoder:
            return TransformerDecoder(vocab_size, encoder_output_size, attention_heads, linear_units, blocks,
                                      dropout_rate, positional_dropout_rate, self_attention_dropout_rate,
                                      src_attention_dropout_rate, normalize_before)

        self.left_decoder = stack(num_blocks)
        self.right_decoder = stack(r_num_blocks)

    def forward(self, memory: torch.Tensor, memory_mask: torch.Tensor, ys_in_pad: torch.Tensor,
                ys_in_lens: torch.Tensor) -> torch.Tensor:
        """The left-to-right decoder's teacher-forced pass: :meth:`TransformerDecoder.forward`'s contract."""
        return self.left_decoder(memory, memory_mask, ys_in_pad, ys_in_lens)

    @torch.jit.export
    def forward_reverse(self, memory: torch.Tensor, memory_mask: torch.Tensor, r_ys_in_pad: torch.Tensor,
                        ys_in_lens: torch.Tensor) -> torch.Tensor:
        """The right-to-left decoder's teacher-forced pass.

        Args:
            memory: float32 (B, T', D) encoder output; memory_mask: bool (B, 1, T').
            r_ys_in_pad: int64 (B, L) ``<sos>`` + the tokens last to first (see
                :func:`toolkit.models.transformer.asr_model.reverse_pad_list`), padding any valid id.
            ys_in_lens: int64 (B,) valid lengths of ``r_ys_in_pad``.

        Returns:
            float32 (B, L, V) logits of the reversed sequence's next tokens (last ``<sos/eos>``).
        """
        return self.right_decoder(memory, memory_mask, r_ys_in_pad, ys_in_lens)

    @torch.jit.export
    def forward_one_step(self, memory: torch.Tensor, memory_mask: torch.Tensor,
                         tgt: torch.Tensor, cache: Optional[list[torch.Tensor]] = None
                         ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The left-to-right decoder's step (attention beam search): :meth:`TransformerDecoder.forward_one_step`."""
        return self.left_decoder.forward_one_step(memory, memory_mask, tgt, cache)
