"""Recognition with sherpa-onnx (k2-fsa/sherpa-onnx, on PyPI as ``sherpa-onnx``) from the exported files: its
WeNet CTC recognizers, offline (``model.onnx``) and streaming (``model-streaming.onnx``), greedy CTC search, and its
own feature extraction (kaldi-native-fbank on the raw samples; sherpa-onnx scales them to 16-bit for WeNet models
and the model holds the CMVN).

``fbank="sherpa"`` keeps sherpa-onnx's WeNet defaults, what its C++ and mobile runtimes use: mel bins up to
7600 Hz (``high_freq`` -400) and frames centred on the signal (``snip_edges`` false). ``fbank="training"`` sets
the two options of the training pipeline (Kaldi's ``compute-fbank-feats`` defaults: bins up to the Nyquist
frequency, ``snip_edges`` true), so sherpa-onnx computes the features the model was trained on. Both keep
sherpa-onnx's dither for offline WeNet models (1.0 on the 16-bit scale, which it sets itself).
"""
from __future__ import annotations

import os

import numpy as np
import soundfile as sf

from toolkit.dataset import processor

FBANK_CHOICES = ("sherpa", "training")
# Silence after the last sample so that the streaming recognizer runs the stream's last chunk windows: sherpa-onnx
# runs a window only once all its frames (and one more) have arrived.
TAIL_PADDING_S = 1.0


def _check_fbank(fbank: str) -> None:
    if fbank not in FBANK_CHOICES:
        raise ValueError(f"fbank {fbank!r}: one of {FBANK_CHOICES}")


def _feature_config(fbank: str, sample_rate: int, feature_dim: int):
    import sherpa_onnx

    config = sherpa_onnx.FeatureExtractorConfig(sampling_rate=sample_rate, feature_dim=feature_dim)
    if fbank == "training":
        config.high_freq, config.snip_edges = 0.0, True
    return config


def _with_fbank(recognizer, fbank: str, native: type):
    """``recognizer`` (built by a ``from_wenet_ctc``, whose signature has no fbank options) rebuilt from its config
    with the ``fbank`` options of the module docstring; itself for ``"sherpa"``."""
    if fbank == "sherpa":
        return recognizer
    config = recognizer.config
    config.feat_config = _feature_config(fbank, config.feat_config.sampling_rate, config.feat_config.feature_dim)
    rebuilt = type(recognizer).__new__(type(recognizer))
    rebuilt.recognizer, rebuilt.config = native(config), config
    return rebuilt


def offline_recognizer(onnx_dir: str, int8: bool = False, fbank: str = "sherpa", num_threads: int = 1,
                       sample_rate: int = 16000, feature_dim: int = 80):
    """sherpa-onnx's ``OfflineRecognizer`` for WeNet CTC models on ``onnx_dir``'s ``model.onnx`` (or
    ``model.int8.onnx``) and ``tokens.txt``; ``fbank`` as the module docstring says."""
    import sherpa_onnx

    _check_fbank(fbank)
    model = os.path.join(onnx_dir, "model.int8.onnx" if int8 else "model.onnx")
    recognizer = sherpa_onnx.OfflineRecognizer.from_wenet_ctc(model=model, tokens=os.path.join(onnx_dir, "tokens.txt"),
                                                             num_threads=num_threads, sample_rate=sample_rate,
                                                             feature_dim=feature_dim)
    return _with_fbank(recognizer, fbank, sherpa_onnx.lib._sherpa_onnx.OfflineRecognizer)


def online_recognizer(onnx_dir: str, chunk_size: int = 16, num_left_chunks: int = 4, int8: bool = False,
                      fbank: str = "sherpa", num_threads: int = 1, sample_rate: int = 16000, feature_dim: int = 80):
    """sherpa-onnx's ``OnlineRecognizer`` for WeNet CTC models on ``model-streaming.onnx`` (or its int8 copy),
    chunks of ``chunk_size`` encoder frames seeing ``num_left_chunks`` chunks to their left."""
    import sherpa_onnx

    _check_fbank(fbank)
    model = os.path.join(onnx_dir, "model-streaming.int8.onnx" if int8 else "model-streaming.onnx")
    recognizer = sherpa_onnx.OnlineRecognizer.from_wenet_ctc(tokens=os.path.join(onnx_dir, "tokens.txt"), model=model,
                                                            chunk_size=chunk_size, num_left_chunks=num_left_chunks,
                                                            num_threads=num_threads, sample_rate=sample_rate,
                                                            feature_dim=feature_dim)
    return _with_fbank(recognizer, fbank, sherpa_onnx.lib._sherpa_onnx.OnlineRecognizer)


def read_wave(path: str, key: str = "", pad_conf_min_length: float = 0.0, frame_shift: float = 10.0
              ) -> tuple[np.ndarray, int]:
    """float32 (N,) samples in [-1, 1) (channels averaged) and the sample rate of the audio file ``path``; with
    ``pad_conf_min_length`` > 0 (frames of ``frame_shift`` ms: the model's ``dataset_conf.pad_conf.min_length``) a
    shorter clip is padded as the training and decoding pipeline pads it (:func:`toolkit.dataset.processor.pad_short`,
    its noise seeded by ``key``), so the model sees the input it was trained on.

    Raises:
        ValueError: unreadable or empty (the path and the reason).
    """
    try:
        samples, rate = sf.read(path, dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise ValueError(f"{path}: {e}") from e
    if samples.shape[0] == 0:
        raise ValueError(f"{path}: no samples")
    sample = {"key": key, "waveform": np.ascontiguousarray(samples.mean(axis=1, dtype=np.float32)),
              "sample_rate": int(rate)}
    if pad_conf_min_length > 0:
        sample = processor.pad_short(sample, frame_shift, pad_conf_min_length)
    return sample["waveform"], sample["sample_rate"]


def transcribe_offline(recognizer, samples: np.ndarray, rate: int) -> str:
    """The text of float32 (N,) ``samples`` at ``rate`` Hz (:func:`read_wave`) by an :func:`offline_recognizer`
    (sherpa-onnx resamples to the model's rate)."""
    stream = recognizer.create_stream()
    stream.accept_waveform(rate, samples)
    recognizer.decode_stream(stream)
    return " ".join(stream.result.text.split())


def transcribe_online(recognizer, samples: np.ndarray, rate: int) -> str:
    """The text of ``samples`` fed whole to an :func:`online_recognizer` stream, then :data:`TAIL_PADDING_S` of
    silence, decoded chunk by chunk."""
    stream = recognizer.create_stream()
    stream.accept_waveform(rate, samples)
    stream.accept_waveform(rate, np.zeros(round(TAIL_PADDING_S * rate), dtype=np.float32))
    stream.input_finished()
    while recognizer.is_ready(stream):
        recognizer.decode_stream(stream)
    return " ".join(recognizer.get_result(stream).split())
