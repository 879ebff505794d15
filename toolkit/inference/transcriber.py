"""Transcription of audio with a trained model: :func:`load_model` gives a :class:`Transcriber` whose
:meth:`~Transcriber.transcribe` takes a file (any format and rate libsndfile reads; channels averaged; resampled to
the model's rate) or an array, and returns the text with each word's start and end time and a confidence;
:meth:`~Transcriber.stream` gives the partial results of a streaming model as its chunks run.

Features are those of decoding a data.list (:func:`toolkit.dataset.pipeline.decoding_features`), the search that of
``recognize.py`` with the model dir's ``decode.yaml`` settings, so both give the same hypothesis for the same audio.

Word times come from the CTC forced alignment of the hypothesis (:func:`ctc_forced_align`): a word starts at the
first CTC frame of its first token and ends after the last frame of its last one. A CTC frame is
``subsampling rate x frame shift / ctc_conf.upsample`` (40 ms for conv2d at 10 ms); times are seconds from the
start of the audio given (the padding of ``dataset_conf.pad_conf`` taken off), clipped to the audio. A word's
confidence is the mean, over its tokens, of the token's CTC posterior at its most probable frame; the
transcript's, the mean over its words.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from toolkit.dataset import processor
from toolkit.dataset.pipeline import decoding_features
from toolkit.inference.decode_conf import DecodeConf
from toolkit.inference.loader import LoadedModel, config_path_of, load_asr_model, load_lm
from toolkit.models.transformer.alignment import ctc_forced_align
from toolkit.models.transformer.asr_model import LM_METHODS
from toolkit.models.transformer.streaming import StreamingDecoder
from toolkit.text.tokenizer import WORD_BOUNDARY, units_to_text
from toolkit.utils.config_parsing import ConfigError


class AudioError(ValueError):
    """One input cannot be transcribed (unreadable, empty, a directory, a rate the model cannot take); the message
    is one line naming it and why."""


@dataclass(frozen=True)
class Word:
    """A recognised word: ``start`` and ``end`` in seconds from the start of the audio, ``confidence`` in [0, 1]."""
    word: str
    start: float
    end: float
    confidence: float


@dataclass(frozen=True)
class Transcript:
    """What :meth:`Transcriber.transcribe` returns: ``text`` (words separated by single spaces), ``words`` (their
    times; empty for a partial result, or when the hypothesis has no CTC alignment), ``confidence`` in [0, 1]
    (0.0 without words), ``key`` (the file name without extension, or the key given), ``partial`` (a stream's
    result before its end)."""
    key: str
    text: str
    words: list[Word] = field(default_factory=list)
    confidence: float = 0.0
    partial: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def key_of(path: str) -> str:
    """The file name without its extension: ``a/b/rec.flac`` -> ``rec``."""
    return os.path.splitext(os.path.basename(path))[0]


class Transcriber:
    """A trained model with its decoding settings, ready to transcribe.

    Args:
        loaded: the model (:func:`toolkit.inference.loader.load_asr_model`).
        decode_conf: the settings to decode with (default: the model dir's ``decode.yaml``).

    Raises:
        ConfigError: a setting the model refuses (``reverse_weight``, a chunk size), or an LM that does not load.
    """

    def __init__(self, loaded: LoadedModel, decode_conf: DecodeConf | None = None):
        self.loaded = loaded
        self.model, self.tokenizer, self.config = loaded.model, loaded.tokenizer, loaded.config
        self.decode_conf = decode_conf or loaded.decode_conf
        conf = self.decode_conf
        try:
            self.reverse_weight = self.model.rescoring_reverse_weight(conf.reverse_weight)
            self.model.encoder.attention_mask(torch.ones(1, 1, 1, dtype=torch.bool), conf.decoding_chunk_size,
                                              conf.num_decoding_left_chunks)
        except ValueError as e:
            raise ConfigError(f"{loaded.model_dir}: {e}") from e
        self.lm = load_lm(self.tokenizer, conf.lm, conf.lm_weight, conf.word_bonus, conf.oov_penalty,
                          conf.spelling_lm) if conf.lm and conf.mode in LM_METHODS else None
        dataset_conf = self.config.dataset_conf
        self.sample_rate = dataset_conf.resample_conf.resample_rate
        encoder = self.model.encoder
        self.ctc_frame_s = encoder.embed.rate * dataset_conf.fbank_conf.frame_shift_s / self.model.ctc.upsample

    @property
    def streaming(self) -> bool:
        """Whether the model was trained for chunks (``encoder_conf.use_dynamic_chunk`` or ``static_chunk_size``)."""
        return bool(self.model.encoder.use_dynamic_chunk or self.model.encoder.static_chunk_size > 0)

    def features(self, audio, sample_rate: int | None = None, key: str | None = None) -> tuple[str, torch.Tensor,
                                                                                                  float, float]:
        """``(key, fbank float32 (T, D) at 10 ms, seconds of padding before the audio, audio seconds)``.

        Args:
            audio: a file path, or a float array/tensor ``(N,)`` or ``(N, channels)`` of samples in [-1, 1).
            sample_rate: Hz, for an array (required); ignored for a file (its header says).

        Raises:
            AudioError: a missing, unreadable, empty or non-finite file or array, a directory, a rate below half the
                model's (upsampling leaves the upper mel bins empty) or none for an array, audio under one frame.
        """
        if isinstance(audio, (str, os.PathLike)):
            path = os.fspath(audio)
            key = key or key_of(path)
            if os.path.isdir(path):
                raise AudioError(f"{path}: a directory, not an audio file")
            try:
                sample = processor.read_audio({"key": key, "wav": path})
            except processor.SkipSample as e:
                raise AudioError(f"{e.detail} ({e.reason})") from e
        else:
            key = key or "audio"
            samples = np.asarray(audio.cpu() if isinstance(audio, torch.Tensor) else audio, dtype=np.float32)
            if samples.ndim == 2:
                samples = samples.mean(axis=1, dtype=np.float32)
            if samples.ndim != 1 or samples.size == 0 or not np.isfinite(samples).all():
                raise AudioError(f"{key}: audio must be a non-empty finite array (N,) or (N, channels), got shape "
                                 f"{samples.shape}")
            if sample_rate is None:
                raise AudioError(f"{key}: an array needs its sample_rate (Hz)")
            sample = {"key": key, "wav": key, "waveform": samples, "sample_rate": sample_rate}
        rate = sample["sample_rate"]
        if not isinstance(rate, int) or rate < self.sample_rate // 2:
            raise AudioError(f"{sample['wav']}: sample rate {rate} Hz; the model takes {self.sample_rate} Hz, and "
                             f"audio below {self.sample_rate // 2} Hz lacks the upper part of its mel bins")
        duration_s = sample["waveform"].shape[0] / rate
        try:
            sample = decoding_features(sample, self.config.dataset_conf)
        except processor.SkipSample as e:
            raise AudioError(f"{sample['wav']}: {e.detail} ({e.reason})") from e
        pad_before_s = round(sample["padding_s"] * self.sample_rate) // 2 / self.sample_rate
        return key, sample["feat"], pad_before_s, duration_s

    def transcribe(self, audio, sample_rate: int | None = None, key: str | None = None) -> Transcript:
        """Recognise one recording with the decoding settings (:attr:`decode_conf`'s ``mode``, beam, LM, ...).

        Args / Raises: as :meth:`features`.
        """
        key, feats, pad_before_s, duration_s = self.features(audio, sample_rate, key)
        conf, device = self.decode_conf, next(self.model.parameters()).device
        lengths = torch.tensor([feats.size(0)])
        with torch.no_grad():
            encoder_out, mask = self.model.encoder(feats.unsqueeze(0).to(device), lengths.to(device),
                                                   conf.decoding_chunk_size, conf.num_decoding_left_chunks)
            tokens = self.model.search([conf.mode], encoder_out, mask, conf.beam_size, conf.ctc_weight,
                                       conf.length_penalty, self.lm, self.reverse_weight)[conf.mode][0]
        return self._transcript(key, tokens, encoder_out[:, :int(mask.sum())], pad_before_s, duration_s)

    def stream(self, audio, sample_rate: int | None = None, key: str | None = None,
               decoding_chunk_size: int | None = None) -> Iterator[Transcript]:
        """Recognise one recording as a stream (U2's two passes, :class:`StreamingDecoder`): the audio is fed in
        pieces of one chunk's stride, a partial :class:`Transcript` (``partial=True``, the best prefix so far) is
        yielded after each piece that ran a chunk, then the final one (the second pass, with word times).

        Args:
            decoding_chunk_size: encoder frames per chunk (default: ``decode.yaml``'s ``streaming_chunk_size``).
            The rest as :meth:`features`.

        Raises:
            ConfigError: the model was not trained for chunks, or its encoder cannot run chunk by chunk.
            AudioError: as :meth:`features`.
        """
        if not self.streaming:
            raise ConfigError(f"{self.loaded.model_dir}: the model was trained with full context (encoder_conf has "
                              "neither use_dynamic_chunk nor static_chunk_size): it cannot stream")
        key, feats, pad_before_s, duration_s = self.features(audio, sample_rate, key)
        conf = self.decode_conf
        chunk = decoding_chunk_size or self.model.encoder.static_chunk_size or conf.streaming_chunk_size
        stream = StreamingDecoder(self.model, chunk, conf.num_decoding_left_chunks, conf.beam_size, self.lm)
        shown = None
        for start in range(0, feats.size(0), stream.stride):
            try:
                partial = stream.accept(feats[start:start + stream.stride])
            except ValueError as e:
                raise ConfigError(f"{self.loaded.model_dir}: {e}") from e
            text = self.tokenizer.detokenize(partial[0].tokens)[0] if partial else ""
            if partial and text != shown:
                shown = text
                yield Transcript(key, text, partial=True)
        with torch.no_grad():
            tokens = stream.finish([conf.mode], conf.ctc_weight, conf.length_penalty, self.reverse_weight)[conf.mode]
        yield self._transcript(key, tokens, stream.encoder_output(), pad_before_s, duration_s)

    def _transcript(self, key: str, tokens: list[int], encoder_out: torch.Tensor, pad_before_s: float,
                    duration_s: float) -> Transcript:
        """The text of ``tokens`` with each word's times from their CTC alignment over ``encoder_out`` (1, T', D)."""
        text, units = self.tokenizer.detokenize(tokens)
        with torch.no_grad():
            spans = ctc_forced_align(self.model.ctc.log_softmax(encoder_out)[0], tokens)
        if spans is None:
            logging.warning("%s: the hypothesis has no CTC alignment (%d tokens in %d CTC frames): no word times",
                            key, len(tokens), encoder_out.size(1) * self.model.ctc.upsample)
            return Transcript(key, text)
        words: list[Word] = []
        pieces: list[tuple[str, object]] = []  # (unit, span) of the word being read

        def close() -> None:
            if pieces:
                first, last = pieces[0][1], pieces[-1][1]
                words.append(Word(units_to_text(unit for unit, _ in pieces), self._seconds(first.start, pad_before_s,
                                                                                            duration_s),
                                  self._seconds(last.end, pad_before_s, duration_s),
                                  round(float(np.mean([span.posterior for _, span in pieces])), 4)))
                pieces.clear()

        for unit, span in zip(units, spans):
            if unit.startswith(WORD_BOUNDARY):
                close()
            if unit != WORD_BOUNDARY:
                pieces.append((unit, span))
        close()
        confidence = round(float(np.mean([w.confidence for w in words])), 4) if words else 0.0
        return Transcript(key, text, words, confidence)

    def _seconds(self, ctc_frame: int, pad_before_s: float, duration_s: float) -> float:
        return round(min(max(ctc_frame * self.ctc_frame_s - pad_before_s, 0.0), duration_s), 3)


def load_model(model_dir: str, checkpoint: str | None = None, device: torch.device | str = "cpu",
               **decode_options) -> Transcriber:
    """A trained model from its dir, ready to transcribe: ``toolkit.load_model("exp/conformer").transcribe("a.wav")``.

    Args:
        model_dir: the dir of ``train.yaml`` (and the files it names, ``decode.yaml``, the checkpoints).
        checkpoint: a path, or a name in ``model_dir``; default: ``decode.yaml``'s, else the newest ``epoch_N.pt``.
        device: where the model runs.
        decode_options: keys of :class:`~toolkit.inference.decode_conf.DecodeConf` overriding ``decode.yaml``
            (``mode="ctc_greedy_search"``, ``beam_size=4``, ``lm=""``...).

    Raises:
        ConfigError: the dir, its ``train.yaml`` or a file it names is missing, the checkpoint is missing or of
            another model, a decoding option is unknown or out of range (one line naming it).
    """
    loaded = load_asr_model(config_path_of(model_dir), checkpoint, device=device)
    try:
        decode_conf = dataclasses.replace(loaded.decode_conf, **decode_options)
    except TypeError as e:
        raise ConfigError(f"load_model: {e}; decoding options are {[f.name for f in dataclasses.fields(DecodeConf)]}"
                          ) from e
    return Transcriber(loaded, decode_conf)
