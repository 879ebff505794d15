"""Main-only sections, and collectives that refuse to run inside one.

A collective entered by rank 0 alone (say a barrier inside ``if rank == 0:``) waits for ranks that never come: the
job hangs until the process-group timeout. Here a main-only section is explicit (:func:`run_on_main`,
:func:`main_process_only`), and every toolkit collective calls :func:`check_collective` first, which raises at once,
naming the call, when it is reached inside such a section. Sections nest.

Which process is main comes from the process group itself (global rank 0) and, for the node-local main, from the
``DistContext`` that :func:`toolkit.distributed.context.init_distributed` registered; without a process group the
single process is main.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, Optional

import torch.distributed as dist

from toolkit.distributed import context

_state = threading.local()


class CollectiveInMainOnlySection(RuntimeError):
    """A collective was called inside a main-only section, where the other ranks can never join it."""


def is_main_process() -> bool:
    """True on global rank 0 (or when no process group exists)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def is_local_main_process() -> bool:
    """True on local rank 0 of this node (node-local preparation: caches, local copies)."""
    ctx = context.current_context()
    return ctx is None or ctx.local_rank == 0


def _depth() -> int:
    return getattr(_state, "depth", 0)


@contextlib.contextmanager
def _main_only_section(name: str) -> Iterator[None]:
    _state.depth = _depth() + 1
    _state.names = getattr(_state, "names", []) + [name]
    try:
        yield
    finally:
        _state.depth -= 1
        _state.names = _state.names[:-1]


def check_collective(call: str) -> None:
    """Raise instead of deadlocking when the collective ``call`` is reached inside a main-only section.

    Raises:
        CollectiveInMainOnlySection: naming ``call`` and the enclosing section(s).
    """
    if _depth():
        raise CollectiveInMainOnlySection(
            f"{call} is a collective (every rank must call it) but was called inside the main-only section "
            f"{' > '.join(_state.names)}; move it out of the section")


def barrier(call: str = "barrier") -> None:
    """``dist.barrier`` guarded by :func:`check_collective`; a no-op without a process group."""
    check_collective(call)
    if dist.is_initialized():
        dist.barrier()


def run_on_main(func: Callable, args: tuple = (), kwargs: Optional[dict] = None,
                post_func: Optional[Callable] = None, post_args: tuple = (),
                post_kwargs: Optional[dict] = None) -> Any:
    """Run ``func`` on the main process while the others wait, then ``post_func`` on the others.

    Every rank must call it (it ends in a barrier). Typical use: main downloads or prepares a file, the others load
    it afterwards in ``post_func``. Returns ``func``'s result on main and ``post_func``'s (or None) elsewhere.

    Raises:
        CollectiveInMainOnlySection: called inside another main-only section (its barrier could never complete).
    """
    check_collective(f"run_on_main({getattr(func, '__name__', func)})")
    result = None
    if is_main_process():
        with _main_only_section(getattr(func, "__name__", "run_on_main")):
            result = func(*args, **(kwargs or {}))
    barrier(f"run_on_main({getattr(func, '__name__', func)})")
    if post_func is not None and not is_main_process():
        result = post_func(*post_args, **(post_kwargs or {}))
    return result


def main_process_only(func: Callable) -> Callable:
    """Decorator: the function runs on the main process only (others get None, without waiting). Collectives
    called inside it raise :class:`CollectiveInMainOnlySection`."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not is_main_process():
            return None
        with _main_only_section(func.__name__):
            return func(*args, **kwargs)

    return wrapper
