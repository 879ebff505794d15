"""toolkit: end-to-end speech recognition training with distributed training that never hangs."""

__version__ = "0.1.0"
