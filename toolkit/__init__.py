"""toolkit: end-to-end speech recognition training with distributed training that never hangs."""
import atexit
import gc

__version__ = "0.1.0"


def _collect_then_freeze() -> None:
    """The last step of a process that imported the toolkit: one full garbage collection (unreachable cycles are
    finalized as the shutdown would have), then every object left is exempted from the collections the interpreter
    runs while it shuts down (it still clears the modules, so a file left open is closed and flushed as before).

    NOTE: those collections walk the tens of thousands of objects of torch's modules, which live to the end anyway:
    1.5 s of every process's exit on a slow 2-core machine (a rank, which imports dynamo through DDP), 0.6 s with
    this (``gc.freeze``, Python 3.7+). Registered when the package is imported, so before the handlers of the
    modules imported after it: ``atexit`` runs it after theirs.
    """
    gc.collect()
    gc.freeze()


atexit.register(_collect_then_freeze)
