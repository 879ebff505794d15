"""toolkit: end-to-end speech recognition training with distributed training that never hangs.

``toolkit.load_model(model_dir)`` loads a trained model for transcription (:func:`toolkit.inference.load_model`).
"""

__version__ = "0.1.0"
__all__ = ["load_model"]


def load_model(model_dir: str, checkpoint: str | None = None, device="cpu", **decode_options):
    """:func:`toolkit.inference.load_model` (imported when first called, so that ``import toolkit`` stays light)."""
    from toolkit.inference import load_model as load
    return load(model_dir, checkpoint, device, **decode_options)
