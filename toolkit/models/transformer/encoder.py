"""Transformer and Conformer encoders sharing one front end and one forward pass.

Transformer: Vaswani et al., 2017 (arXiv:1706.03762), with the speech front end of
Dong et al., 2018 (Speech-Transformer). Conformer: Gulati et al., 2020 (arXiv:2005.08100). Optional
temporal U-Net of Squeezeformer (Kim et al., 2022, arXiv:2206.00888): the middle blocks at half the frame rate.
Optional self-conditioned CTC (Nozaki & Komatsu, 2021, arXiv:2104.02724): the intermediate CTC posteriors fed back
into the layers above. Optional streaming (U2/U2++: Zhang et al., 2020, arXiv:2012.05481; Wu et al., 2021,
arXiv:2106.05642; WeNet's ``encoder_conf`` keys): chunk-wise self-attention masks, dynamic or static, in training and
decoding, a causal convolution module, and :meth:`BaseEncoder.forward_chunk`, which encodes a stream chunk by chunk
with attention and convolution caches.
"""
from collections.abc import Sequence
from typing import Optional, TypeVar

import torch
from torch import nn

from toolkit.models.activation_checkpointing import checkpointed
from toolkit.models.transformer.attention import (MultiHeadedAttention,
                                                  RelPositionMultiHeadedAttention)
from toolkit.models.transformer.convolution import ConvolutionModule
from toolkit.models.transformer.ctc import CTC
from toolkit.models.transformer.embedding import PositionalEncoding, RelPositionalEncoding
from toolkit.models.transformer.encoder_layer import (ConformerEncoderLayer,
                                                      TransformerEncoderLayer)
from toolkit.models.transformer.positionwise_feed_forward import PositionwiseFeedForward
from toolkit.models.transformer.subsampling import Conv2dSubsampling
from toolkit.utils.mask import draw_dynamic_chunk, make_pad_mask, subsequent_chunk_mask

ACTIVATIONS = {"relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU}
POS_ENCODINGS = {"abs_pos": PositionalEncoding, "rel_pos": RelPositionalEncoding}
SELF_ATTENTIONS = {"selfattn": MultiHeadedAttention,
                   "rel_selfattn": RelPositionMultiHeadedAttention}
SUBSAMPLING_RATES = {"conv2d": 4, "conv2d8": 8}  # input_layer -> frame-rate reduction
# NOTE: dynamic chunks of at most 1 s (100 fbank frames: 25 encoder frames after conv2d, 12 after conv2d8), WeNet's
# bound (U2, arXiv:2012.05481, section 2.3).
MAX_DYNAMIC_CHUNK_10MS = 100
T = TypeVar("T")


def _choose(kind: str, name: str, table: dict[str, T]) -> T:
    """Look ``name`` up in ``table``; ValueError listing the valid names otherwise."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(table)}")
    return table[name]


class TimeReduction(nn.Module):
    """Halve the frame rate between two encoder blocks: a depthwise convolution (kernel 5, stride 2) over the
    zeroed-out padding, then a pointwise linear layer (Squeezeformer's time reduction, arXiv:2206.00888).

    Args:
        size: feature size D.
    """

    def __init__(self, size: int):
        super().__init__()
        self.depthwise = nn.Conv1d(size, size, kernel_size=5, stride=2, padding=2, groups=size)
        self.pointwise = nn.Linear(size, size)

    def forward(self, xs: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (B, T, D) and bool (B, 1, T) -> (B, ceil(T / 2), D) and (B, 1, ceil(T / 2)): output frame j
        is centred on input frame 2j, so an utterance of L valid frames keeps ceil(L / 2)."""
        xs = xs.masked_fill(~masks.transpose(1, 2), 0.0)
        xs = self.depthwise(xs.transpose(1, 2)).transpose(1, 2)
        return self.pointwise(xs), masks[:, :, ::2]


class TimeRecovery(nn.Module):
    """Restore the frame rate of :class:`TimeReduction`: each reduced frame, through a linear layer, is repeated
    twice and added to the frames that entered the reduction (the U-Net's skip connection).

    Args:
        size: feature size D.
    """

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)

    def forward(self, xs: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) at the reduced rate and (B, T, D), T' = ceil(T / 2) -> (B, T, D)."""
        return skip + self.linear(xs).repeat_interleave(2, dim=1)[:, :skip.size(1)]


def _check_streaming(static_chunk_size: int, use_dynamic_chunk: bool, use_dynamic_left_chunk: bool) -> None:
    """ValueError, in one line naming the key, for streaming keys of the wrong type or that contradict each other
    (WeNet ignores ``static_chunk_size`` under ``use_dynamic_chunk``; here that is an error, not a silent choice)."""
    for key, value in (("use_dynamic_chunk", use_dynamic_chunk), ("use_dynamic_left_chunk", use_dynamic_left_chunk)):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
    if isinstance(static_chunk_size, bool) or not isinstance(static_chunk_size, int) or static_chunk_size < 0:
        raise ValueError(f"static_chunk_size must be an int >= 0 (encoder frames; 0: off), got {static_chunk_size!r}")
    if use_dynamic_chunk and static_chunk_size > 0:
        raise ValueError(f"use_dynamic_chunk and static_chunk_size {static_chunk_size}: choose one (dynamic chunks "
                         "already cover every chunk size)")
    if use_dynamic_left_chunk and not use_dynamic_chunk:
        raise ValueError("use_dynamic_left_chunk needs use_dynamic_chunk: true")


def _shorter_pos_emb(pos_emb: torch.Tensor, time: int, reduced: int) -> torch.Tensor:
    """The positional encoding of ``reduced`` frames cut from that of ``time``: relative (1, 2 time - 1, D), the
    distances time - 1 .. -(time - 1), keeps reduced - 1 .. -(reduced - 1); absolute (1, time, D) its first
    ``reduced``. A distance then counts reduced frames (80 ms after a 40 ms front end), as in Squeezeformer."""
    if pos_emb.size(1) == 2 * time - 1:
        return pos_emb[:, time - reduced:time + reduced - 1]
    return pos_emb[:, :reduced]


class BaseEncoder(nn.Module):
    """Optional global CMVN, Conv2dSubsampling, a stack of encoder layers, final LayerNorm.

    Subclasses fill ``self.encoders`` (an nn.ModuleList of layers with the signature
    ``layer(x, mask, pos_emb, mask_pad, att_cache=None, cnn_cache=None) -> (x, new_att_cache, new_cnn_cache)``, the
    caches for :meth:`forward_chunk`).

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
        interctc_layer_idx: layers, numbered from 1 and below the last, whose outputs (through the final
            LayerNorm) :meth:`forward_layers` also returns, for intermediate CTC (``model_conf.interctc_weight``;
            Lee & Watanabe, 2021, "Intermediate Loss Regularization for CTC-based Speech Recognition",
            arXiv:2102.03216). Empty: none.
        time_reduce_idx, time_recover_idx: Squeezeformer's temporal U-Net (arXiv:2206.00888): after layer
            ``time_reduce_idx`` (numbered from 1) the frame rate halves (:class:`TimeReduction`), after layer
            ``time_recover_idx`` it is restored (:class:`TimeRecovery`), so the layers between run on half the
            frames (80 ms after conv2d) and the output keeps the front end's rate. 0 and 0: off. Not with streaming
            (its convolution sees future frames).
        static_chunk_size: train and decode with chunk-wise self-attention (:func:`subsequent_chunk_mask`) of this
            many encoder frames; 0: off.
        use_dynamic_chunk: dynamic chunk training (U2): each training batch draws its mask
            (:func:`draw_dynamic_chunk`): full context about half of the time, otherwise a chunk of 1 .. 25 encoder
            frames (1 s: 12 after conv2d8), so that one model decodes at full context and at any chunk size.
        use_dynamic_left_chunk: with ``use_dynamic_chunk``, also draw how many chunks to the left a frame sees
            (else all).

    The self-attention mask of :meth:`forward` comes from ``decoding_chunk_size`` (encoder frames) and
    ``num_decoding_left_chunks`` (WeNet's meaning): > 0 chunks of that size seeing that many chunks to their left
    (-1: all); -1 full context; 0 the model's own: in training mode the dynamic draw, or the static chunk; in eval
    mode the static chunk, or full context (so validation losses of a dynamic-chunk model are full-context ones).

    Raises:
        ValueError: unknown ``input_layer`` or ``pos_enc_layer_type``; an ``interctc_layer_idx`` entry outside
            1 .. num_blocks - 1 or between the reduction and the recovery (its frames would not be the output's);
            not 1 <= ``time_reduce_idx`` < ``time_recover_idx`` <= num_blocks unless both are 0 (checked when the
            subclass sets its layers); a streaming key not a bool or a non-negative int, ``use_dynamic_chunk`` with
            ``static_chunk_size``, ``use_dynamic_left_chunk`` without ``use_dynamic_chunk``, or streaming with the
            time reduction.
    """
    interctc_layer_idx: list[int]  # for TorchScript, which cannot type an empty list by its value

    def __init__(self, input_size: int, output_size: int, dropout_rate: float,
                 positional_dropout_rate: float, input_layer: str, pos_enc_layer_type: str,
                 normalize_before: bool, global_cmvn: Optional[nn.Module], subsampling_channels: int = 0,
                 interctc_layer_idx: Sequence[int] = (), time_reduce_idx: int = 0, time_recover_idx: int = 0,
                 static_chunk_size: int = 0, use_dynamic_chunk: bool = False, use_dynamic_left_chunk: bool = False):
        super().__init__()
        _check_streaming(static_chunk_size, use_dynamic_chunk, use_dynamic_left_chunk)
        self.static_chunk_size = static_chunk_size
        self.use_dynamic_chunk = use_dynamic_chunk
        self.use_dynamic_left_chunk = use_dynamic_left_chunk
        self.causal = False  # a ConformerEncoder's convolution modules; set before its layers
        rate = _choose("input_layer", input_layer, SUBSAMPLING_RATES)
        pos_enc = _choose("pos_enc_layer_type", pos_enc_layer_type, POS_ENCODINGS)
        self._output_size = output_size
        self.global_cmvn = global_cmvn
        self.embed = Conv2dSubsampling(input_size, output_size, pos_enc(output_size, positional_dropout_rate),
                                       subsampling_channels, rate)
        self.max_dynamic_chunk = MAX_DYNAMIC_CHUNK_10MS // rate
        self.normalize_before = normalize_before
        # Post-norm layers already end in a LayerNorm.
        self.after_norm = nn.LayerNorm(output_size, eps=1e-12) if normalize_before else None
        self.encoders = nn.ModuleList()
        self.interctc_layer_idx = sorted(set(interctc_layer_idx))
        self.time_reduce_idx, self.time_recover_idx = time_reduce_idx, time_recover_idx
        self.time_reduction = TimeReduction(output_size) if time_reduce_idx else None
        self.time_recovery = TimeRecovery(output_size) if time_reduce_idx else None
        self.activation_checkpointing = False  # set by ASRModel.set_activation_checkpointing
        # Self-conditioned CTC, set by ASRModel through set_self_conditioning (the CTC head is the model's).
        self.conditioning_ctc: Optional[CTC] = None
        self.conditioning_layer: Optional[nn.Linear] = None

    def _set_layers(self, layers: list[nn.Module]) -> None:
        """The subclass's layer stack, against which ``interctc_layer_idx`` and the U-Net's layers are checked."""
        bad = [i for i in self.interctc_layer_idx if not 1 <= i < len(layers)]
        if bad:
            raise ValueError(f"interctc_layer_idx {bad} outside 1 .. num_blocks - 1 = {len(layers) - 1} (layers "
                             "numbered from 1; the last layer's output is the CTC head's input already)")
        reduce, recover = self.time_reduce_idx, self.time_recover_idx
        if (reduce, recover) != (0, 0):
            if not 1 <= reduce < recover <= len(layers):
                raise ValueError(f"time_reduce_idx {reduce} and time_recover_idx {recover}: need 1 <= "
                                 f"time_reduce_idx < time_recover_idx <= num_blocks = {len(layers)}, or both 0")
            streaming = self.streaming_keys()
            if streaming:
                raise ValueError(f"time_reduce_idx {reduce} and {' / '.join(streaming)}: Squeezeformer's time "
                                 "reduction sees future frames and does not run chunk-wise; drop one of them")
            halved = [i for i in self.interctc_layer_idx if reduce < i < recover]
            if halved:
                raise ValueError(f"interctc_layer_idx {halved} between time_reduce_idx {reduce} and "
                                 f"time_recover_idx {recover}: those layers run at half the frame rate")
        self.encoders = nn.ModuleList(layers)
        self.chunkwise_error = ""  # why forward_chunk cannot run, "" when it can
        if reduce:
            self.chunkwise_error = (f"time_reduce_idx {reduce}: Squeezeformer's time reduction does not run chunk by "
                                    "chunk")
        elif any(getattr(layer, "conv_module", None) is not None and layer.conv_module.lorder == 0
                 for layer in layers):
            self.chunkwise_error = ("chunk-by-chunk encoding needs encoder_conf.causal: true (this convolution "
                                    "module sees future frames)")

    def set_self_conditioning(self, ctc: CTC) -> None:
        """Self-conditioned CTC (Nozaki & Komatsu, 2021, "Relaxing the Conditional Independence Assumption of
        CTC-based ASR by Conditioning on Intermediate Predictions", arXiv:2104.02724): after each layer of
        ``interctc_layer_idx`` the CTC posteriors of its output (through the final LayerNorm and ``ctc``'s
        projection, float32 (B, T', upsample x V)) are projected back to the model size by a new linear layer and
        added to it, in training and decoding alike, so the layers above see what the layers below predict.
        ``ctc`` is the model's head, shared (its weights appear under this encoder's keys too).

        Raises:
            ValueError: no ``interctc_layer_idx`` to condition on.
        """
        if not self.interctc_layer_idx:
            raise ValueError("self-conditioned CTC needs encoder_conf.interctc_layer_idx (the layers whose CTC "
                             "posteriors are fed back)")
        self.conditioning_ctc = ctc
        self.conditioning_layer = nn.Linear(ctc.ctc_lo.out_features, self._output_size)

    def extra_repr(self) -> str:
        return f"activation_checkpointing={self.activation_checkpointing}"

    def output_size(self) -> int:
        """Model size of the encoder output."""
        return self._output_size

    def output_lengths(self, xs_lens: torch.Tensor) -> torch.Tensor:
        """int64 (B,) fbank frames -> int64 (B,) valid encoder frames (0 for a clip shorter than
        the front end's receptive field: 7 frames for conv2d, 15 for conv2d8)."""
        return self.embed.output_lengths(xs_lens)

    def streaming_keys(self) -> list[str]:
        """The streaming keys of ``encoder_conf`` that are set (``use_dynamic_chunk``, ``static_chunk_size``, and
        ``causal`` for a conformer); empty for a full-context model."""
        keys = ["use_dynamic_chunk"] if self.use_dynamic_chunk else []
        keys += ["static_chunk_size"] if self.static_chunk_size > 0 else []
        return keys + (["causal"] if self.causal else [])

    def untrained_chunk_note(self, decoding_chunk_size: int) -> str:
        """One line saying that decoding at ``decoding_chunk_size`` (> 0 encoder frames, -1 full context) is a
        setting the model was not trained for, or ``""``: a full-context model at a chunk size, a
        ``static_chunk_size`` model at another chunk or at full context."""
        asked = "full context" if decoding_chunk_size < 0 else f"chunks of {decoding_chunk_size} encoder frames"
        if decoding_chunk_size > 0 and not self.use_dynamic_chunk and self.static_chunk_size == 0:
            return (f"the model was trained with full context (encoder_conf has neither use_dynamic_chunk nor "
                    f"static_chunk_size): it was not trained for {asked}")
        if 0 < self.static_chunk_size != decoding_chunk_size:
            return f"the model was trained with static_chunk_size {self.static_chunk_size}: not for {asked}"
        return ""

    def forward(self, xs: torch.Tensor, xs_lens: torch.Tensor, decoding_chunk_size: int = 0,
                num_decoding_left_chunks: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a zero-padded batch of fbank features.

        Args:
            xs: float32 (B, T, D) fbank, T frames at 10 ms.
            xs_lens: int64 (B,) valid frames per utterance.
            decoding_chunk_size, num_decoding_left_chunks: the self-attention mask (see the class docstring).

        Returns:
            encoder_out: float32 (B, T', output_size), T' = :meth:`output_lengths` of max(T, receptive
                field) (40 ms frames for conv2d, 80 ms for conv2d8); values at padded frames are unspecified.
            masks: bool (B, 1, T'), True at valid frames; per utterance
                :meth:`output_lengths` of them (0 below the receptive field).

        Raises:
            RuntimeError: D differs from ``input_size``.
            ValueError: ``decoding_chunk_size`` < -1, ``num_decoding_left_chunks`` < -1, or a chunk with the time
                reduction.
        """
        xs, masks, _ = self.forward_layers(xs, xs_lens, [], decoding_chunk_size, num_decoding_left_chunks)
        return xs, masks

    def forward_layers(self, xs: torch.Tensor, xs_lens: torch.Tensor, layer_idx: list[int],
                       decoding_chunk_size: int = 0, num_decoding_left_chunks: int = -1
                       ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward`, and the outputs of the layers numbered (from 1) in ``layer_idx``, each through the
        final LayerNorm as the last layer's is: float32 (B, T', output_size) each, in layer order (the
        intermediate CTC of :class:`~toolkit.models.transformer.asr_model.ASRModel` reads
        ``interctc_layer_idx``'s). With self-conditioning (:meth:`set_self_conditioning`) a layer's returned output
        is the one before its posteriors are added."""
        masks = ~make_pad_mask(xs_lens, xs.size(1)).unsqueeze(1)
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        xs, pos_emb, masks = self.embed(xs, masks)
        att_masks = self.attention_mask(masks, decoding_chunk_size, num_decoding_left_chunks)
        intermediate: list[torch.Tensor] = []
        skip, skip_masks, skip_pos_emb = xs, masks, pos_emb  # what enters the time reduction
        for i, layer in enumerate(self.encoders):
            # NOTE: TorchScript compiles only the else branch (is_scripting() is a constant there).
            if not torch.jit.is_scripting() and self.activation_checkpointing and self.training \
                    and torch.is_grad_enabled():
                xs = checkpointed(layer, xs, att_masks, pos_emb, masks)[0]
            else:
                xs = layer(xs, att_masks, pos_emb, masks)[0]
            if self.time_recovery is not None and i + 1 == self.time_recover_idx:
                xs, masks, pos_emb = self.time_recovery(xs, skip), skip_masks, skip_pos_emb
                att_masks = masks
            if i + 1 in layer_idx:
                intermediate.append(self._final_norm(xs))
            xs = self._condition(xs, i, intermediate[-1] if i + 1 in layer_idx else None)
            if self.time_reduction is not None and i + 1 == self.time_reduce_idx:
                skip, skip_masks, skip_pos_emb = xs, masks, pos_emb
                xs, masks = self.time_reduction(xs, masks)
                att_masks = masks
                pos_emb = _shorter_pos_emb(pos_emb, skip.size(1), xs.size(1))
        return self._final_norm(xs), masks, intermediate

    def _condition(self, xs: torch.Tensor, index: int, normed: Optional[torch.Tensor]) -> torch.Tensor:
        """Self-conditioning after layer ``index`` (from 0) when it is one of ``interctc_layer_idx``: ``xs`` plus
        its CTC posteriors projected back (``normed``: its final-norm output if already computed); ``xs`` as is
        otherwise. Per frame, so a chunk of a stream conditions as the whole utterance does."""
        # NOTE: TorchScript drops this branch where the attributes are None (no self-conditioning).
        if self.conditioning_layer is not None and self.conditioning_ctc is not None \
                and index + 1 in self.interctc_layer_idx:
            if normed is None:
                normed = self._final_norm(xs)
            xs = xs + self.conditioning_layer(self.conditioning_ctc.posteriors(normed))
        return xs

    def attention_mask(self, masks: torch.Tensor, decoding_chunk_size: int, num_decoding_left_chunks: int
                       ) -> torch.Tensor:
        """The self-attention mask for the padding mask ``masks`` (bool (B, 1, T'), True at valid frames) and the
        chunk options of :meth:`forward`: ``masks`` itself at full context, else bool (B, T', T'), ``masks`` and
        :func:`subsequent_chunk_mask`.

        Raises:
            ValueError: ``decoding_chunk_size`` or ``num_decoding_left_chunks`` < -1, or a chunk with the time
                reduction.
        """
        if decoding_chunk_size < -1 or num_decoding_left_chunks < -1:
            raise ValueError(f"decoding_chunk_size {decoding_chunk_size} / num_decoding_left_chunks "
                             f"{num_decoding_left_chunks}: the chunk is > 0 encoder frames or -1 (full context), "
                             "the left chunks >= 0 or -1 (all)")
        max_len = masks.size(2)
        chunk, left = max_len, -1
        if decoding_chunk_size > 0:
            if self.time_reduction is not None:
                raise ValueError(f"decoding_chunk_size {decoding_chunk_size} with time_reduce_idx "
                                 f"{self.time_reduce_idx}: Squeezeformer's time reduction does not run chunk-wise")
            chunk, left = decoding_chunk_size, num_decoding_left_chunks
        elif decoding_chunk_size == 0 and self.use_dynamic_chunk and self.training:
            chunk, left = draw_dynamic_chunk(max_len, self.use_dynamic_left_chunk, self.max_dynamic_chunk)
        elif decoding_chunk_size == 0 and self.static_chunk_size > 0:
            chunk, left = self.static_chunk_size, num_decoding_left_chunks
        if chunk >= max_len and left < 0:
            return masks
        return masks & subsequent_chunk_mask(max_len, chunk, left, masks.device).unsqueeze(0)

    @torch.jit.export
    def forward_chunk(self, xs: torch.Tensor, offset: int, required_cache_size: int,
                      att_cache: torch.Tensor = torch.zeros(0, 0, 0, 0),
                      cnn_cache: torch.Tensor = torch.zeros(0, 0, 0, 0),
                      att_mask: torch.Tensor = torch.ones(0, 0, 0, dtype=torch.bool)
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode one chunk of a stream, given the caches of the frames before it (nothing of the past is
        recomputed; WeNet's ``forward_chunk``, the same arguments and meaning).

        Args:
            xs: float32 (1, T, D) fbank of the chunk, T = (C - 1) * subsampling rate + receptive field (the front
                end's right context included) for C encoder frames out; the windows of consecutive chunks overlap
                by receptive field - subsampling rate frames (:meth:`forward_chunk_by_chunk`).
            offset: encoder frames of the stream before this chunk (the chunk's absolute position).
            required_cache_size: encoder frames of attention cache to return for the next chunk: < 0 all,
                0 none, N > 0 the last N (chunk size x left chunks).
            att_cache: float32 (num_blocks, H, S, 2 D / H), each layer's attention keys then values of the S
                encoder frames before the chunk; (0, 0, 0, 0) at the start.
            cnn_cache: float32 (num_blocks, 1, output_size, kernel_size - 1), each layer's causal convolution input
                at the frames before the chunk; (0, 0, 0, 0) at the start (and always for a Transformer).
            att_mask: bool (1, C, S + C), True where a key takes part (for a batch of padded caches, as WeNet's
                ONNX export feeds it); (0, 0, 0): every key.

        Returns:
            output: float32 (1, C, output_size).
            att_cache: float32 (num_blocks, H, S', 2 D / H), S' = min(S + C, required_cache_size) (S + C for < 0).
            cnn_cache: float32 (num_blocks, 1, output_size, kernel_size - 1) (a conformer's; (num_blocks, 0, 0, 0)
                without convolution modules).

        Raises:
            ValueError: a batch of more than one, the time reduction, or a convolution module that is not causal
                (``encoder_conf.causal``).
        """
        if xs.size(0) != 1:
            raise ValueError(f"forward_chunk encodes one stream (batch 1), got a batch of {xs.size(0)}")
        if self.chunkwise_error:
            raise ValueError(self.chunkwise_error)
        if self.global_cmvn is not None:
            xs = self.global_cmvn(xs)
        cached = att_cache.size(2)
        xs, pos_emb, _ = self.embed(xs, torch.ones(1, 1, xs.size(1), dtype=torch.bool, device=xs.device), offset,
                                    cached)
        keys = cached + xs.size(1)
        next_cache_start = 0 if required_cache_size < 0 else max(keys - required_cache_size, 0)
        mask_pad = torch.ones(1, 1, xs.size(1), dtype=torch.bool, device=xs.device)
        new_att_caches: list[torch.Tensor] = []
        new_cnn_caches: list[torch.Tensor] = []
        for i, layer in enumerate(self.encoders):
            layer_att_cache = att_cache[i:i + 1] if cached > 0 else att_cache
            layer_cnn_cache = cnn_cache[i] if cnn_cache.size(0) > 0 else cnn_cache.new_zeros(0, 0, 0)
            xs, new_att_cache, new_cnn_cache = layer(xs, att_mask, pos_emb, mask_pad, layer_att_cache,
                                                     layer_cnn_cache)
            if new_att_cache is None or new_cnn_cache is None:
                raise RuntimeError("an encoder layer returned no cache for a chunk")  # for TorchScript's types
            new_att_caches.append(new_att_cache[:, :, next_cache_start:])
            new_cnn_caches.append(new_cnn_cache)
            xs = self._condition(xs, i, None)
        return self._final_norm(xs), torch.cat(new_att_caches, dim=0), torch.stack(new_cnn_caches)

    def chunk_windows(self, decoding_chunk_size: int, num_decoding_left_chunks: int = -1) -> tuple[int, int, int]:
        """How a stream feeds :meth:`forward_chunk` chunks of ``decoding_chunk_size`` C encoder frames seeing
        ``num_decoding_left_chunks`` chunks to their left (-1: all): ``(stride, window, required_cache_size)``, a
        window of (C - 1) x rate + receptive field fbank frames every C x rate frames (rate: the front end's
        subsampling), so each encoder frame sees exactly the fbank frames it sees in :meth:`forward`, and the
        attention cache to keep (-1: all).

        Raises:
            ValueError: ``decoding_chunk_size`` < 1 or ``num_decoding_left_chunks`` < -1.
        """
        if decoding_chunk_size < 1 or num_decoding_left_chunks < -1:
            raise ValueError(f"decoding_chunk_size {decoding_chunk_size} / num_decoding_left_chunks "
                             f"{num_decoding_left_chunks}: chunk by chunk needs a chunk > 0 encoder frames and "
                             "left chunks >= 0 or -1 (all)")
        rate = self.embed.rate
        required_cache_size = decoding_chunk_size * num_decoding_left_chunks if num_decoding_left_chunks >= 0 else -1
        return rate * decoding_chunk_size, (decoding_chunk_size - 1) * rate + self.embed.receptive_field, \
            required_cache_size

    def forward_chunk_by_chunk(self, xs: torch.Tensor, decoding_chunk_size: int, num_decoding_left_chunks: int = -1
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode one utterance as a stream, chunk by chunk through :meth:`forward_chunk` with its caches, in the
        windows of :meth:`chunk_windows`. In eval mode this equals :meth:`forward` with the same ``decoding_chunk_size`` and
        ``num_decoding_left_chunks`` up to rounding.

        Args:
            xs: float32 (1, T, D) fbank, 10 ms frames.
            decoding_chunk_size: C > 0 encoder frames per chunk.
            num_decoding_left_chunks: chunks to the left each chunk sees; -1 all.

        Returns:
            float32 (1, T', output_size), T' = :meth:`output_lengths` of T (0 under the receptive field), and bool
            (1, 1, T') all True.

        Raises:
            ValueError: as :meth:`chunk_windows` and :meth:`forward_chunk`.
        """
        stride, window, required_cache_size = self.chunk_windows(decoding_chunk_size, num_decoding_left_chunks)
        context = self.embed.receptive_field
        att_cache = cnn_cache = xs.new_zeros(0, 0, 0, 0)
        outputs = [xs.new_zeros(1, 0, self._output_size)]
        offset = 0
        for start in range(0, xs.size(1) - context + 1, stride):
            chunk, att_cache, cnn_cache = self.forward_chunk(xs[:, start:start + window], offset, required_cache_size,
                                                             att_cache, cnn_cache)
            outputs.append(chunk)
            offset += chunk.size(1)
        ys = torch.cat(outputs, dim=1)
        return ys, torch.ones(1, 1, ys.size(1), dtype=torch.bool, device=ys.device)

    def _final_norm(self, xs: torch.Tensor) -> torch.Tensor:
        if self.after_norm is not None:
            xs = self.after_norm(xs)
        return xs


class TransformerEncoder(BaseEncoder):
    """Transformer encoder; keyword arguments equal the ``encoder_conf`` keys.

    Args:
        attention_heads, linear_units, num_blocks: heads, FFN inner size and number of layers.
        attention_dropout_rate: dropout on attention weights.
        selfattention_layer_type: ``"selfattn"`` or ``"rel_selfattn"`` (needs ``rel_pos``).
        activation_type: FFN activation, ``"relu"``, ``"swish"`` or ``"gelu"``.
        Others: see :class:`BaseEncoder`.

    Raises:
        ValueError: unknown layer/activation names, rel_selfattn without rel_pos, or a bad ``interctc_layer_idx``.
    """

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, attention_dropout_rate: float = 0.0,
                 input_layer: str = "conv2d", normalize_before: bool = True,
                 pos_enc_layer_type: str = "abs_pos", selfattention_layer_type: str = "selfattn",
                 activation_type: str = "relu", subsampling_channels: int = 0,
                 global_cmvn: Optional[nn.Module] = None, interctc_layer_idx: Sequence[int] = (),
                 time_reduce_idx: int = 0, time_recover_idx: int = 0, static_chunk_size: int = 0,
                 use_dynamic_chunk: bool = False, use_dynamic_left_chunk: bool = False):
        super().__init__(input_size, output_size, dropout_rate, positional_dropout_rate, input_layer,
                         pos_enc_layer_type, normalize_before, global_cmvn, subsampling_channels, interctc_layer_idx,
                         time_reduce_idx, time_recover_idx, static_chunk_size, use_dynamic_chunk,
                         use_dynamic_left_chunk)
        attention = _attention_class(selfattention_layer_type, pos_enc_layer_type)
        activation = _choose("activation_type", activation_type, ACTIVATIONS)
        self._set_layers([
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
        cnn_module_norm: ``"batch_norm"`` or ``"layer_norm"`` (recommended with ``causal``: see
            :class:`~toolkit.models.transformer.convolution.ConvolutionModule`).
        causal: causal convolution modules (left-only padding, no future frame), needed by :meth:`forward_chunk`.
        Others: see :class:`TransformerEncoder`.

    Raises:
        ValueError: unknown names, rel_selfattn without rel_pos, an even kernel, or a bad ``interctc_layer_idx``.
    """

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4,
                 linear_units: int = 2048, num_blocks: int = 6, dropout_rate: float = 0.1,
                 positional_dropout_rate: float = 0.1, attention_dropout_rate: float = 0.0,
                 input_layer: str = "conv2d", normalize_before: bool = True,
                 pos_enc_layer_type: str = "rel_pos",
                 selfattention_layer_type: str = "rel_selfattn", activation_type: str = "swish",
                 macaron_style: bool = True, use_cnn_module: bool = True,
                 cnn_module_kernel: int = 15, cnn_module_norm: str = "batch_norm",
                 subsampling_channels: int = 0, global_cmvn: Optional[nn.Module] = None,
                 interctc_layer_idx: Sequence[int] = (), time_reduce_idx: int = 0, time_recover_idx: int = 0,
                 static_chunk_size: int = 0, use_dynamic_chunk: bool = False, use_dynamic_left_chunk: bool = False,
                 causal: bool = False):
        super().__init__(input_size, output_size, dropout_rate, positional_dropout_rate, input_layer,
                         pos_enc_layer_type, normalize_before, global_cmvn, subsampling_channels, interctc_layer_idx,
                         time_reduce_idx, time_recover_idx, static_chunk_size, use_dynamic_chunk,
                         use_dynamic_left_chunk)
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be true or false, got {causal!r}")
        self.causal = causal
        attention = _attention_class(selfattention_layer_type, pos_enc_layer_type)
        activation = _choose("activation_type", activation_type, ACTIVATIONS)

        def feed_forward() -> PositionwiseFeedForward:
            return PositionwiseFeedForward(output_size, linear_units, dropout_rate, activation())

        self._set_layers([
            ConformerEncoderLayer(
                output_size, attention(attention_heads, output_size, attention_dropout_rate),
                feed_forward(), feed_forward() if macaron_style else None,
                ConvolutionModule(output_size, cnn_module_kernel, activation(), cnn_module_norm, causal=causal)
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
