"""The end of a command's process: what its entry point (``cli()`` of each ``toolkit/bin`` command) asks for when it
starts, so that importing the package changes nothing."""
import atexit
import gc


def _collect_then_freeze() -> None:
    """One full garbage collection (unreachable cycles are finalized as the shutdown would have), then every object
    left is exempted from the collections the interpreter runs while it shuts down (it still clears the modules, so a
    file left open is closed and flushed as before)."""
    gc.collect()
    gc.freeze()


def freeze_at_exit() -> None:
    """Register :func:`_collect_then_freeze` to run at the process's exit: after the ``atexit`` handlers registered
    later (a command's own, such as :mod:`toolkit.distributed.context`'s), before those of the modules imported
    earlier (logging's flush, multiprocessing's finalizers), whose work the freeze does not stop. Call once, first
    thing in a command.

    NOTE: the shutdown's collections walk the tens of thousands of objects of torch's modules, which live to the end
    anyway: 1.5 s of every process's exit on a slow 2-core machine (a rank, which imports dynamo through DDP), 0.6 s
    with this (``gc.freeze``, Python 3.7+; docs/benchmarks.md, "Exit"). A library import must not change how the
    process ends, so the commands ask for it, not the package.
    """
    atexit.register(_collect_then_freeze)
