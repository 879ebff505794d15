"""Transformer and Conformer encoders sharing one front end and one forward pass.

Transformer: Vaswani et al., 2017 (arXiv:1706.03762), with the speech front end of
Dong et al., 2018 (Speech-Transformer). Conformer: Gulati et al., 2020 (arXiv:2005.08100).
"""
from typing import Optional, TypeVar

import torch
from torch import nn

from toolkit.models.activation_checkpointing import checkpointed
from toolkit.models.transformer.attention import (MultiHeadedAttention,
                                                  RelPositionMultiHeadedAttention)
from toolkit.models.transformer.convolution import ConvolutionModule
from toolkit.models.transformer.embedding import PositionalEncoding, RelPositionalEncoding
from toolkit.models.transformer.encoder_layer import (ConformerEncoderLayer,
                                                      TransformerEncoderLayer)
from toolkit.models.transformer.positionwise_feed_forward import PositionwiseFeedForward
from toolkit.models.transformer.subsampling import Conv2dSubsampling
from toolkit.utils.mask import make_pad_mask

ACTIVATIONS = {"relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU}
POS_ENCODINGS = {"abs_pos": PositionalEncoding, "rel_pos": RelPositionalEncoding}
SELF_ATTENTIONS = {"selfattn": MultiHeadedAttention,
                   "rel_selfattn": RelPositionMultiHeadedAttention}
SUBSAMPLING_RATES = {"conv2d": 4, "conv2d8": 8}  # input_layer -> frame-rate reduction
T = TypeVar("T")


def _choose(kind: str, name: str, table: dict[str, T]) -> T:
    """Look ``name`` up in ``table``; ValueError listing the valid names otherwise."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(table)}")
    return table[name]


class BaseEncoder(nn.Module):
    """Optional global CMVN, Conv2dSubsampling, a stack of encoder layers, final LayerNorm.

    Subclasses fill ``self.encoders`` (an nn.ModuleList of layers with the signature
    ``layer(x, mask, pos_emb, mask_pad)``).

    Args:
        input_size: feature size D of the fbank input.
        output_size: model size.
        dropout_rate, positional_dropout_rate: dropout in the layers / after positional encoding.
        input_layer: front end, ``"conv2d"`` (4x subsampling: 40 ms encoder frames) or ``"conv2d8"`` (8x: 80 ms,
            half the encoder's work per second of audio; for units of several characters, e.g. BPE, as
            CTC needs an encoder frame per unit and a character lasts about 70 ms in read English).
        subsampling_channels: conv channels of the front end; 0 means ``output_size``.
        pos_enc_layer_type: ``"abs_pos"`` or ``"rel_pos"``.
        normalize_before: pre-norm layers (then a final LayerNorm is applied).
        global_cmvn: GlobalCMVN applied to the input, or None.

    Raises:
        ValueError: unknown ``input_layer`` or ``pos_enc_layer_type``.
    """

    def __init__(self, input_size: int, output_size: int, dropout_rate: float,
                 positional_dropout_rate: float, input_layer: str, pos_enc_layer_type: str,
                 normalize_before: bool, global_cmvn: Optional[nn.Module], subsampling_channels: int = 0):
        super().__init__()
        rate = _choose("input_layer", input_layer, SUBSAMPLING_RATES)
        pos_enc = _choose("pos_enc_layer_type", pos_enc_layer_type, POS_ENCODINGS)
        self._output_size = output_size
        self.global_cmvn = global_cmvn
        self.embed = Conv2dSubsampling(input_size, output_size, pos_enc(output_size, positional_dropout_rate),
                                       subsampling_channels, rate)
        self.normalize_before = normalize_before
        # Post-norm layers already end in a LayerNorm.
        self.after_norm = nn.LayerNorm(output_size, eps=1e-12) if normalize_before else None
        self.encoders = nn.ModuleList()
        self.activation_checkpointing = False  # set by ASRModel.set_activation_checkpointing

    def extra_repr(self) -> str:
        return f"activation_checkpointing={self.activation_checkpointing}"

    def output_size(self) -> int:
        """Model size of the encoder output."""
        return self._output_size

    def output_lengths(self, xs_lens: torch.Tensor) -> torch.Tensor:
        """int64 (B,) fbank frames -> int64 (B,) valid encoder frames (0 for a clip shorter than
        the front end's receptive field: 7 frames for conv2d, 15 for conv2d8)."""
        return self.embed.output_lengths(xs_lens)

    def forward(self, xs: torch.Tensor, xs_lens: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a zero-padded batch of fbank features.

        Args:
            xs: float32 (B, T, D) fbank, T frames at 10 ms.
            xs_lens: int64 (B,) valid frames per utterance.

        Returns:
            encoder_out: float32 (B, T', output_size), T' = :meth:`output_lengths` of max(T, receptive
                field) (40 ms frames for conv2d, 80 ms for conv2d8); values at padded frames are unspecified.
            masks: bool (B, 1, T'), True at valid frames; per utterance
                :meth:`output_lengths` of them (0 below the receptive field).

        Raises:
            RuntimeError: D differs from ``input_size``.
        """
        masks = ~make_pad_mask(xs_lens, xs.size(1)).unsqueeze(1)
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        xs, pos_emb, masks = self.embed(xs, masks)
        for layer in self.encoders:
            # NOTE: TorchScript compiles only the else branch (is_scripting() is a constant there).
            if not torch.jit.is_scripting() and self.activation_checkpointing and self.training \
                    and torch.is_grad_enabled():
                xs = checkpointed(layer, xs, masks, pos_emb, masks)
            else:
                xs = layer(xs, masks, pos_emb, masks)
        if self.after_norm is not None:
            xs = self.after_norm(xs)
        return xs, masks


class TransformerEncoder(BaseEncoder):
    """Transformer encoder; keyword arguments equal the ``encoder_conf`` keys.

    Args:
        attention_heads, linear_units, num_blocks: heads, FFN inner size and number of layers.
        attention_dropout_rate: dropout on attention weights.
        selfattention_layer_type: ``"selfattn"`` or ``"rel_selfattn"`` (needs ``rel_pos``).
        activation_type: FFN activation, ``"relu"``, ``"swish"`` or ``"gelu"``.
        Others: see :class:`BaseEncoder`.

    Raises:
        ValueError: unknown layer/activation names, or rel_selfattn without rel_pos.
    """

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, attention_dropout_rate: float = 0.0,
                 input_layer: str = "conv2d", normalize_before: bool = True,
                 pos_enc_layer_type: str = "abs_pos", selfattention_layer_type: str = "selfattn",
                 activation_type: str = "relu", subsampling_channels: int = 0,
                 global_cmvn: Optional[nn.Module] = None):
        super().__init__(input_size, output_size, dropout_rate, positional_dropout_rate,
                         input_layer, pos_enc_layer_type, normalize_before, global_cmvn, subsampling_channels)
        attention = _attention_class(selfattention_layer_type, pos_enc_layer_type)
        activation = _choose("activation_type", activation_type, ACTIVATIONS)
        self.encoders = nn.ModuleList([
            TransformerEncoderLayer(
                output_size, attention(attention_heads, output_size, attention_dropout_rate),
                PositionwiseFeedForward(output_size, linear_units, dropout_rate, activation()),
                dropout_rate, normalize_before)
            for _ in range(num_blocks)])


class ConformerEncoder(BaseEncoder):
    """Conformer encoder; keyword arguments equal the ``encoder_conf`` keys.

    Args:
        macaron_style: two half-step FFNs around the attention/conv branches.
        use_cnn_module: include the convolution module.
        cnn_module_kernel: depthwise kernel width (odd).
        cnn_module_norm: ``"batch_norm"`` or ``"layer_norm"``.
        Others: see :class:`TransformerEncoder`.

    Raises:
        ValueError: unknown names, rel_selfattn without rel_pos, or an even kernel.
    """

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, attention_dropout_rate: float = 0.0,
                 input_layer: str = "conv2d", normalize_before: bool = True,
                 pos_enc_layer_type: str = "rel_pos",
                 selfattention_layer_type: str = "rel_selfattn", activation_type: str = "swish",
                 macaron_style: bool = True, use_cnn_module: bool = True,
                 cnn_module_kernel: int = 15, cnn_module_norm: str = "batch_norm",
                 subsampling_channels: int = 0, global_cmvn: Optional[nn.Module] = None):
        super().__init__(input_size, output_size, dropout_rate, positional_dropout_rate,
                         input_layer, pos_enc_layer_type, normalize_before, global_cmvn, subsampling_channels)
        attention = _attention_class(selfattention_layer_type, pos_enc_layer_type)
        activation = _choose("activation_type", activation_type, ACTIVATIONS)

        def feed_forward() -> PositionwiseFeedForward:
            return PositionwiseFeedForward(output_size, linear_units, dropout_rate, activation())

        self.encoders = nn.ModuleList([
            ConformerEncoderLayer(
                output_size, attention(attention_heads, output_size, attention_dropout_rate),
                feed_forward(), feed_forward() if macaron_style else None,
                ConvolutionModule(output_size, cnn_module_kernel, activation(), cnn_module_norm)
                if use_cnn_module else None,
                dropout_rate, normalize_before)
            for _ in range(num_blocks)])


def _attention_class(selfattention_layer_type: str, pos_enc_layer_type: str) -> type:
    """The self-attention class, checked against the positional encoding it needs."""
    attention = _choose("selfattention_layer_type", selfattention_layer_type, SELF_ATTENTIONS)
    if (attention is RelPositionMultiHeadedAttention) != (pos_enc_layer_type == "rel_pos"):
        raise ValueError("selfattention_layer_type rel_selfattn goes with pos_enc_layer_type "
                         f"rel_pos, got {selfattention_layer_type!r} with {pos_enc_layer_type!r}")
    return attention
