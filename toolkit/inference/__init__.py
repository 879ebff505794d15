"""A trained model used from its model dir: :func:`load_model` and its :class:`Transcriber` (files or arrays to text
with word times; a streaming model's partial results), the loader every decoding command shares
(:func:`load_asr_model`), and the model dir's decoding settings (:class:`DecodeConf`, ``decode.yaml``)."""

from toolkit.inference.decode_conf import DecodeConf, read_decode_conf
from toolkit.inference.loader import LoadedModel, load_asr_model
from toolkit.inference.transcriber import AudioError, Transcriber, Transcript, Word, load_model

__all__ = ["AudioError", "DecodeConf", "LoadedModel", "Transcriber", "Transcript", "Word", "load_asr_model",
           "load_model", "read_decode_conf"]
