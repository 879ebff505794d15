"""A model dir's decoding settings: ``decode.yaml``, one home for what the recipe tuned (written by run.sh stage 5,
read by run.sh stage 5 through ``recognize.py``, by ``recognize.py`` and by ``toolkit-transcribe`` and
:func:`toolkit.load_model`; a command-line option overrides its key).

Keys (each optional; the default when the file or the key is absent): ``checkpoint`` (the model to decode, relative
to the model dir, e.g. ``avg_3.pt``; empty: the newest committed ``epoch_N.pt``), ``mode`` (the decoding method of
transcription, one of :data:`~toolkit.models.transformer.asr_model.DECODING_METHODS`), ``beam_size``, ``ctc_weight``,
``reverse_weight`` (null: the model's ``model_conf.reverse_weight``), ``length_penalty``, ``decoding_chunk_size`` and
``num_decoding_left_chunks`` (encoder frames of 40 ms after conv2d; -1: full context / all), ``streaming_chunk_size``
(encoder frames per chunk of a live stream, ``--streaming``), ``lm`` and ``spelling_lm`` (ARPA or KenLM files,
relative to the model dir; empty: none), ``lm_weight``, ``word_bonus``, ``oov_penalty`` (their meaning:
``recognize.py --help`` and :class:`toolkit.text.ngram_lm.WordNgramLM`). An unknown key or a wrongly typed value is
one line naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from toolkit.models.transformer.asr_model import decoding_modes_error
from toolkit.utils.config_parsing import ConfigError, load_config, require, typed

DECODE_CONF = "decode.yaml"
PATH_KEYS = ("checkpoint", "lm", "spelling_lm")


@dataclass(frozen=True)
class DecodeConf:
    """The decoding settings of ``decode.yaml`` (module docstring); paths as written there until
    :func:`read_decode_conf` resolves them against the model dir."""

    checkpoint: str = ""
    mode: str = "attention_rescoring"
    beam_size: int = 10
    ctc_weight: float = 0.5
    reverse_weight: Optional[float] = None
    length_penalty: float = 0.0
    decoding_chunk_size: int = -1
    num_decoding_left_chunks: int = -1
    streaming_chunk_size: int = 16
    lm: str = ""
    lm_weight: float = 0.5
    word_bonus: float = 0.0
    oov_penalty: float = 0.0
    spelling_lm: str = ""

    def __post_init__(self):
        error = decoding_modes_error([self.mode])
        if error:
            raise ConfigError(f"mode: {error}")
        require(self.beam_size >= 1, "beam_size", ">= 1", self.beam_size)
        require(self.decoding_chunk_size > 0 or self.decoding_chunk_size == -1, "decoding_chunk_size",
                "> 0 (encoder frames per chunk) or -1 (full context)", self.decoding_chunk_size)
        require(self.num_decoding_left_chunks >= -1, "num_decoding_left_chunks", ">= 0 or -1 (all)",
                self.num_decoding_left_chunks)
        require(self.streaming_chunk_size > 0, "streaming_chunk_size", "> 0 (encoder frames per chunk)",
                self.streaming_chunk_size)
        require(self.lm_weight >= 0, "lm_weight", ">= 0", self.lm_weight)
        require(self.oov_penalty <= 0, "oov_penalty", "<= 0", self.oov_penalty)


def read_decode_conf(model_dir: str) -> DecodeConf:
    """``model_dir/decode.yaml`` with its paths (``checkpoint``, ``lm``, ``spelling_lm``) joined to ``model_dir``;
    the defaults of :class:`DecodeConf` when the file is absent.

    Raises:
        ConfigError: the file is not YAML, has an unknown key or a bad value, or names a file that does not exist
            (one line naming the file and the key).
    """
    path = os.path.join(model_dir, DECODE_CONF)
    if not os.path.exists(path):
        return DecodeConf()
    given = load_config(path)
    try:
        conf = typed(DecodeConf, given, "")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    resolved = {}
    for key in PATH_KEYS:
        value = getattr(conf, key)
        if value:
            resolved[key] = os.path.join(model_dir, value)
            if not os.path.isfile(resolved[key]):
                raise ConfigError(f"{path}: {key} {value}: no such file in {model_dir}")
    return DecodeConf(**{**conf.__dict__, **resolved})
