"""The torch modules that become the exported ONNX graphs: their inputs and outputs are the files' interface.

The CTC graphs follow sherpa-onnx's WeNet CTC interface (k2-fsa/sherpa-onnx ``scripts/wenet/`` and
``sherpa-onnx/csrc/{offline,online}-wenet-ctc-model.cc``), so that its recognizers load them as WeNet's own:

- :class:`CtcGraph`, ``model.onnx``: inputs ``x`` float32 (N, T, D) fbank (10 ms frames, 16-bit sample scale, no
  CMVN: the model's global CMVN is inside) and ``x_lens`` int64 (N,); outputs ``log_probs`` float32 (N, T', V),
  ``log_probs_lens`` int64 (N,) and ``encoder_out`` float32 (N, T', D_model) for the rescoring decoder (sherpa-onnx
  reads the first two).
- :class:`ChunkGraph`, ``model-streaming.onnx``: one chunk of one stream; inputs in sherpa-onnx's order ``x``
  float32 (1, T, D) fbank window, ``offset`` int64 (1,), ``required_cache_size`` int64 (1,), ``attn_cache`` float32
  (num_blocks, H, S, 2 D_model / H), ``conv_cache`` float32 (num_blocks, 1, D_model, cnn_module_kernel - 1) and
  ``attn_mask`` bool (1, 1, S + C); outputs ``log_probs`` float32 (1, C, V), ``next_attn_cache`` (the last S
  frames' keys and values) and ``next_conv_cache``, the same shapes as the caches in. The runtime keeps the attention
  cache at a fixed S = chunk size x left chunks frames from the first chunk on, zeros that ``attn_mask`` masks
  until the stream has that many frames.
- :class:`DecoderGraph`, ``decoder.onnx``: the attention decoder's teacher-forced pass for attention rescoring.
"""
from __future__ import annotations

import torch
from torch import nn

from toolkit.models.transformer.embedding import RelPositionalEncoding


class CtcGraph(nn.Module):
    """Fbank to CTC log-posteriors over whole utterances (the encoder's default context: full context, or its
    ``static_chunk_size``; ``recognize.py``'s default ``--decoding_chunk_size 0``).

    Args:
        model: an :class:`~toolkit.models.transformer.asr_model.ASRModel` in eval mode.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder, self.ctc = model.encoder, model.ctc

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 (N, T, D) and int64 (N,) -> log_probs float32 (N, T', V) (rows past a length unspecified),
        log_probs_lens int64 (N,), encoder_out float32 (N, T', D_model)."""
        encoder_out, masks = self.encoder(x, x_lens)
        encoder_lens = masks.squeeze(1).sum(1)
        return self.ctc.log_softmax(encoder_out), self.ctc.output_lengths(encoder_lens), encoder_out


class ChunkGraph(nn.Module):
    """One chunk of a stream through the encoder's :meth:`~toolkit.models.transformer.encoder.BaseEncoder.forward_chunk`
    with a fixed-size attention cache, then the CTC head (the interface of the module docstring).

    ``offset`` and ``required_cache_size`` are in the interface because sherpa-onnx feeds them; a relative-position
    encoder does not depend on the stream position, and the cache kept is the input cache's size S, so the graph
    reads them only to keep them inputs (a zero added to the output).

    Args:
        model: an ASRModel in eval mode with a streaming, relative-position encoder (see :func:`streaming_error`).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder, self.ctc = model.encoder, model.ctc

    def forward(self, x: torch.Tensor, offset: torch.Tensor, required_cache_size: torch.Tensor,
                attn_cache: torch.Tensor, conv_cache: torch.Tensor, attn_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """See the module docstring for the shapes."""
        cache_size = attn_cache.size(2)
        out, next_attn_cache, next_conv_cache = self.encoder.forward_chunk(x, 0, cache_size, attn_cache, conv_cache,
                                                                           attn_mask)
        # NOTE: ONNX drops graph inputs nothing reads, and sherpa-onnx passes all six by position: a zero keeps them.
        unused = (offset - offset + required_cache_size - required_cache_size).to(out.dtype)
        return self.ctc.log_softmax(out) + unused.view(1, 1, 1), next_attn_cache, next_conv_cache


class DecoderGraph(nn.Module):
    """The attention decoder's teacher-forced pass over an n-best (:func:`~toolkit.models.transformer.search.
    attention_rescoring`'s scores come from its log-softmax).

    Inputs ``encoder_out`` float32 (N, T', D_model) and ``encoder_out_lens`` int64 (N,) (from ``model.onnx``, one row
    per hypothesis), ``hyps_in`` int64 (N, L) (``<sos>`` + tokens, padded with ``<eos>``), ``hyps_in_lens`` int64 (N,)
    and, with a bidirectional decoder, ``r_hyps_in`` int64 (N, L) (``<sos>`` + the tokens last to first); outputs
    ``log_probs`` float32 (N, L, V) and ``r_log_probs`` (N, L, V) for the right-to-left decoder.

    Args:
        model: an ASRModel in eval mode.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.decoder = model.decoder
        self.bidirectional = hasattr(model.decoder, "forward_reverse")

    def forward(self, encoder_out: torch.Tensor, encoder_out_lens: torch.Tensor, hyps_in: torch.Tensor,
                hyps_in_lens: torch.Tensor, r_hyps_in: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """See the class docstring for the shapes."""
        frames = torch.arange(encoder_out.size(1), device=encoder_out.device)
        memory_mask = (frames.unsqueeze(0) < encoder_out_lens.unsqueeze(1)).unsqueeze(1)  # (N, 1, T')
        log_probs = self.decoder(encoder_out, memory_mask, hyps_in, hyps_in_lens).log_softmax(dim=2)
        if r_hyps_in is None:
            return log_probs
        return log_probs, self.decoder.forward_reverse(encoder_out, memory_mask, r_hyps_in,
                                                       hyps_in_lens).log_softmax(dim=2)


def streaming_error(model: nn.Module) -> str:
    """Why ``model`` has no chunk graph, in one line, or ``""``: its encoder was not trained for streaming
    (``encoder_conf`` has neither ``use_dynamic_chunk`` nor ``static_chunk_size``), a conformer's convolution is
    not causal, or the positional encoding is absolute (its positions would need the stream's offset)."""
    encoder = model.encoder
    if not encoder.use_dynamic_chunk and encoder.static_chunk_size == 0:
        return ("the model was not trained for streaming (encoder_conf has neither use_dynamic_chunk nor "
                "static_chunk_size): no streaming export")
    if encoder.chunkwise_error:
        return encoder.chunkwise_error
    if not isinstance(encoder.embed.pos_enc, RelPositionalEncoding):
        return "the streaming export needs encoder_conf.pos_enc_layer_type rel_pos (abs_pos depends on the offset)"
    return ""
