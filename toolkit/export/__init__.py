"""A trained model as ONNX files for onnxruntime and sherpa-onnx (``toolkit-export``, docs/export.md): the graphs
(:mod:`.graphs`), writing them (:mod:`.onnx`), their checks against torch (:mod:`.check`), and decoding them with
sherpa-onnx (:mod:`.sherpa`)."""

from toolkit.export.check import ExportCheckError, check_export
from toolkit.export.onnx import export_model

__all__ = ["ExportCheckError", "check_export", "export_model"]
