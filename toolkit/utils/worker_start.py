"""How the toolkit's worker processes start (DataLoader workers, the process pools of ``tools/``): forked while the
calling process runs no other thread, from a forkserver otherwise; and the script shapes a forkserver cannot serve,
refused at once with one line saying what to do; how a worker logs: as the process that started it
(:class:`LogSetup`, :func:`start_worker_logging`); and a pool's workers and torchrun's ranks end with the process
that started them, killed or not (:func:`stop_with_parent`).

Forking is what makes a user's script work in any shape (a file without ``if __name__ == "__main__":``, ``python -``,
``python -c``): the child has the parent's memory, so it runs none of the main module again and has every class the
script defined. But a fork while another thread holds a lock leaves the child with that lock held for good: a
thread entering Python (gloo's, in a rank) holds CPython's thread-state lock for an instant, and a child forked then
hangs inside ``os.fork()`` (CPython gh-112275, Python 3.8-3.11). So a process with another Python thread or a
``torch.distributed`` process group (every toolkit rank) starts its workers from a forkserver, a fresh
single-threaded process; such a worker re-imports the main module (as ``spawn`` does) and unpickles what it is sent
by reference, which is where the script shapes fail.

NOTE: a native thread that enters Python without a ``threading.Thread`` or a process group (an extension library's
own) is not seen; the known ones of the toolkit's processes are gloo's, under the process group. The compute pools
of OpenBLAS/OpenMP (present once numpy or torch is imported) never enter Python and handle a fork themselves.
"""
import ast
import ctypes
import dataclasses
import functools
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
from multiprocessing.reduction import ForkingPickler

class WorkerStartError(RuntimeError):
    """Worker processes cannot start in this process's script shape; the message says what to do instead."""


def fork_is_safe() -> bool:
    """Whether a fork cannot inherit a lock held by another thread: this process runs no other Python thread and
    has no ``torch.distributed`` process group (not imported here: a process that never imported it has none)."""
    dist = sys.modules.get("torch.distributed")
    return threading.active_count() == 1 and not (dist is not None and dist.is_available() and dist.is_initialized())


def worker_context(sent: object, what: str, serial: str) -> multiprocessing.context.BaseContext:
    """The context to start worker processes in: ``fork`` where :func:`fork_is_safe`, else ``forkserver``.

    Args:
        sent: what each worker receives pickled (the dataset, the pool's function and items): with the
            forkserver it must not need a class of the main module that the workers cannot import.
        what: the workers, for the message (e.g. "loader workers").
        serial: how to do the work without them, for the message (e.g. "set num_workers: 0").

    Raises:
        WorkerStartError: with the forkserver, a main module the workers cannot run again (read from stdin, or a
            file without an ``if __name__ == "__main__":`` guard) or an object of the main module's own classes
            where there is no file to import them from (``python -c``, a notebook); one line saying what to do.
    """
    if fork_is_safe():
        return multiprocessing.get_context("fork")
    problem = _forkserver_problem(sent)
    if problem:
        others = [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()]
        beside = f"other Python threads ({', '.join(others)})" if others else "a torch.distributed process group"
        why = f"{what} start from a forkserver here, not forked, because this process runs {beside}, beside which " \
              "a fork can hang"
        raise WorkerStartError(f"{why}, and {problem}, or {serial}")
    return multiprocessing.get_context("forkserver")


@dataclasses.dataclass(frozen=True)
class LogSetup:
    """This process's logging, as a worker can rebuild it: the root logger's level and, for each root handler
    writing to stderr, stdout or a file, ``(destination, formatter, level)`` with destination ``"<stderr>"``,
    ``"<stdout>"`` or the file's absolute path. Handlers of other kinds (a queue, a test's capture) are left out."""
    level: int
    handlers: tuple

    @classmethod
    def of_this_process(cls) -> "LogSetup":
        root, handlers = logging.getLogger(), []
        for handler in root.handlers:
            if isinstance(handler, logging.FileHandler):
                handlers.append((handler.baseFilename, handler.formatter, handler.level))
            elif type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout):
                handlers.append(("<stderr>" if handler.stream is sys.stderr else "<stdout>", handler.formatter,
                                 handler.level))
        return cls(root.level, tuple(handlers))


def start_worker_logging(setup: LogSetup) -> None:
    """Worker side (a loader's ``worker_init_fn``, a pool's ``initializer``): log as the process that started the
    workers (``setup``: :meth:`LogSetup.of_this_process` there), to the same destinations in the same format, so
    that a line a worker logs (a skipped utterance's key and reason) reaches that process's log once, with its
    time, rank and level.

    NOTE: a worker started from the forkserver inherits no handler, and Python's last-resort handler printed its
    warnings bare (no time, rank or level: a ``grep`` of the log for a skip found none of them) and dropped its
    info lines. A forked worker has the parent's handler objects already (a test's capture included) and keeps
    them. Files are opened for appending, like the parent's.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    for destination, formatter, level in setup.handlers:
        if destination in ("<stderr>", "<stdout>"):
            handler = logging.StreamHandler(sys.stderr if destination == "<stderr>" else sys.stdout)
        else:
            handler = logging.FileHandler(destination, mode="a", encoding="utf-8")
        handler.setFormatter(formatter)
        handler.setLevel(level)
        root.addHandler(handler)
    root.setLevel(setup.level)


# <linux/prctl.h>: the signal a process gets when the thread that started it ends (its parent's end, here).
_PR_SET_PDEATHSIG = 1


def stop_with_parent() -> None:
    """End this process (SIGKILL) as soon as its parent ends, however it ends, ``kill -9`` included: a worker (a
    pool's, a torchrun rank) whose parent is gone has nobody to report to, and would otherwise run on, orphaned
    (a ``ProcessPoolExecutor``'s workers wait for work for good). Linux only (``prctl(PR_SET_PDEATHSIG)``, the
    kernel's), elsewhere nothing. Call it first thing in the worker (a pool's ``initializer``).

    NOTE: the kernel signals when the *thread* that started the process ends, so the starter must start it from a
    thread that lives as long as the process should: torchrun's agent starts its ranks from its main thread, and
    the toolkit's pools start their workers from the thread that waits for their results. A parent that ended
    before this call left the process with another parent already (init, pid 1, or a subreaper): under pid 1 the
    process ends here; under a subreaper it is not seen (the parent must have died in the seconds between
    starting the process and this call).

    Raises:
        OSError: ``prctl`` refused (it does not for a valid signal).
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if parent == 1 or os.getppid() != parent:  # the parent ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def start_pool_worker(setup: LogSetup) -> None:
    """A tool's pool worker (a ``ProcessPoolExecutor``'s ``initializer``): it ends with its parent
    (:func:`stop_with_parent`) and logs as the process that started it (:func:`start_worker_logging`)."""
    stop_with_parent()
    start_worker_logging(setup)


def _forkserver_problem(sent: object) -> str | None:
    """Why a forkserver worker would fail in this process's script shape, with what to do, or None."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if path is not None and not os.path.isfile(path):
        return f"a worker runs the main script again, which has no file ({path}): save the script to a file " \
               f"and run that"
    if path is not None and not _has_main_guard(os.path.abspath(path)):
        return f"a worker runs the top level of {path} again, which starts the workers again: put the code that " \
               f"starts them under `if __name__ == \"__main__\":`"
    if path is None and getattr(main.__spec__, "name", None) is None:
        names = _main_names(sent)
        if names:
            return f"a worker cannot import {', '.join(names)}, defined in __main__ (python -c, or a notebook): " \
                   f"define it in a module file and import it from there"
    return None


@functools.lru_cache(maxsize=None)
def _has_main_guard(path: str) -> bool:
    """Whether the module file ``path`` has a top-level ``if __name__ == "__main__":``."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and {"__name__", "__main__"} <= {getattr(n, "id", getattr(n, "value", None))
                                                for n in (node.test.left, *node.test.comparators)}
               for node in tree.body)


def _main_names(sent: object) -> list[str]:
    """The qualified names of the main module's classes and functions that pickling ``sent`` refers to."""
    names = set()

    class Recorder(ForkingPickler):
        def persistent_id(self, obj):
            # an instance answers with its class's module; a class or function with its own
            if getattr(obj, "__module__", None) == "__main__":
                names.add(getattr(obj, "__qualname__", None) or type(obj).__qualname__)
            return None

    Recorder(_Discard()).dump(sent)
    return sorted(names)


class _Discard:
    """A binary file that keeps nothing: the pickler's output is not needed, only what it visits."""

    def write(self, data) -> int:
        return len(data)
