"""Recognition of one utterance as a stream: U2's two passes (Zhang et al., 2020, arXiv:2012.05481; Wu et al., 2021,
arXiv:2106.05642). Fbank frames arrive in pieces of any size; every chunk window that is complete runs the encoder's
:meth:`~toolkit.models.transformer.encoder.BaseEncoder.forward_chunk` with its attention and convolution caches
(nothing of the past is recomputed), and its CTC log-posteriors advance an incremental CTC prefix beam search
(:class:`~toolkit.models.transformer.search.CtcPrefixBeamSearch`, with the LM), whose partial n-best a caller reads
after each piece. At the end of the stream the last, shorter window runs, and the attention decoder rescores the
n-best over the whole encoder output (the second pass), as :meth:`ASRModel.decode` does.
"""
from __future__ import annotations

import torch

from toolkit.models.transformer.search import CtcPrefixBeamSearch, Hypothesis, PrefixLM


class StreamingDecoder:
    """One utterance of ``model`` decoded chunk by chunk; call :meth:`accept` as fbank frames arrive, then
    :meth:`finish` once.

    The fbank windows are the encoder's (:meth:`BaseEncoder.chunk_windows`: (C - 1) x rate + receptive field frames
    every C x rate frames; rate 4 and receptive field 7 for conv2d), so a window runs as soon as its last frame has
    arrived, and the results equal the encoder's masked whole-utterance
    forward at the same ``decoding_chunk_size`` and ``num_decoding_left_chunks`` (up to float rounding), every
    decoding method included.

    Args:
        model: an :class:`~toolkit.models.transformer.asr_model.ASRModel` in eval mode whose encoder is streaming
            (``encoder_conf.causal`` for a conformer's convolution).
        decoding_chunk_size: C > 0 encoder frames per chunk.
        num_decoding_left_chunks: chunks to the left each chunk's attention sees; -1: all (the cache grows).
        beam_size: the CTC prefix beam search's beam (and attention rescoring's n-best).
        lm: language model fused into the prefix beam search, or None.

    Raises:
        ValueError: ``decoding_chunk_size`` < 1 or ``num_decoding_left_chunks`` < -1 (:meth:`BaseEncoder.chunk_windows`;
            the encoder's refusals of :meth:`BaseEncoder.forward_chunk` come with the first chunk).
    """

    def __init__(self, model, decoding_chunk_size: int, num_decoding_left_chunks: int = -1, beam_size: int = 10,
                 lm: PrefixLM | None = None):
        self.model, self.lm = model, lm
        self.stride, self.window, self.required_cache_size = model.encoder.chunk_windows(decoding_chunk_size,
                                                                                      num_decoding_left_chunks)
        self.context = model.encoder.embed.receptive_field
        self.search = CtcPrefixBeamSearch(beam_size, lm)
        self.partial: list[Hypothesis] = []
        self._pending = torch.zeros(0, 0)  # fbank frames from the next window's start on
        self._offset = 0
        self._att_cache = self._cnn_cache = torch.zeros(0, 0, 0, 0)
        self._outputs: list[torch.Tensor] = []

    def accept(self, feats: torch.Tensor) -> list[Hypothesis]:
        """Take the next fbank frames of the stream and run every chunk window now complete.

        Args:
            feats: float32 (T, D) fbank frames (10 ms), T >= 0, following the frames given before.

        Returns:
            The partial n-best after the chunks run so far, best first (the search's, see
            :class:`CtcPrefixBeamSearch`; empty before the first chunk).
        """
        feats = feats.to(self._device)
        self._pending = feats if self._pending.numel() == 0 else torch.cat([self._pending, feats])
        while self._pending.size(0) >= self.window:
            self._run(self._pending[:self.window])
            self._pending = self._pending[self.stride:]
        return self.partial

    def finish(self, methods: list[str], ctc_weight: float = 0.5, length_penalty: float = 0.0,
               reverse_weight: float | None = None) -> dict[str, list[int]]:
        """End the stream: run the windows that the last frames started (shorter than a full one, down to the
        receptive field), then every method of ``methods`` over the whole encoder output, with the prefix beam
        search's n-best (:meth:`ASRModel.search`; the arguments as :meth:`ASRModel.decode`'s).

        Returns:
            {method: token ids}; every method's empty for a stream shorter than the receptive field.
        """
        while self._pending.size(0) >= self.context:
            self._run(self._pending[:self.window])
            self._pending = self._pending[self.stride:]
        if not self._outputs:
            return {method: [] for method in methods}
        encoder_out = self.encoder_output()
        mask = torch.ones(1, 1, encoder_out.size(1), dtype=torch.bool, device=encoder_out.device)
        results = self.model.search(methods, encoder_out, mask, self.search.beam_size, ctc_weight, length_penalty,
                                    self.lm, reverse_weight, nbests=[self.search.finish()])
        return {method: hyps[0] for method, hyps in results.items()}

    def encoder_output(self) -> torch.Tensor:
        """float32 (1, T', D): the encoder output of every chunk run so far ((1, 0, D) before the first)."""
        if not self._outputs:
            return torch.zeros(1, 0, self.model.encoder.output_size(), device=self._device)
        return torch.cat(self._outputs, dim=1)

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def _run(self, window: torch.Tensor) -> None:
        """One chunk: ``window`` (T, D) through the encoder with the caches, its CTC frames into the search."""
        out, self._att_cache, self._cnn_cache = self.model.encoder.forward_chunk(
            window.unsqueeze(0), self._offset, self.required_cache_size, self._att_cache, self._cnn_cache)
        self._offset += out.size(1)
        self._outputs.append(out)
        self.partial = self.search.feed(self.model.ctc.log_softmax(out)[0])
