"""The DataLoader around an :class:`~toolkit.dataset.pipeline.AsrDataset` and its workers' lifecycle: they are
forked only from a process without other threads, start from a forkserver otherwise, and end when the process
iterating the loader does."""
import functools
import importlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import sys
import threading

import torch
from torch.utils.data import DataLoader

from toolkit.dataset import processor
from toolkit.dataset.conf import DatasetConf, resolve_dataset_conf
from toolkit.dataset.pipeline import AsrDataset
from toolkit.utils.worker_start import LogSetup, start_worker_logging, worker_context


def build_dataloader(dataset: AsrDataset, conf: DatasetConf | dict | None = None) -> DataLoader:
    """Wrap ``dataset`` in a DataLoader (``batch_size=None``: the dataset already yields batches).

    ``dataloader_conf`` of ``conf`` (default: the dataset's own ``dataset_conf``) sets num_workers,
    prefetch_factor, pin_memory and persistent_workers; the worker-only options are dropped when num_workers is 0.

    The loader gets its own ``torch.Generator`` seeded with ``dataset.seed`` (reseed it per epoch through
    ``loader.generator``). NOTE: without one, every ``iter(loader)`` draws the workers' base seed from the global
    torch RNG, so where dropout's random stream stands would depend on how many loaders were iterated (an exact
    resume would diverge).

    Workers start as :func:`loader_context` says when they start (each ``iter`` that starts them), log as this
    process does then (:func:`start_worker`), and end when the process iterating the loader does.

    Raises:
        toolkit.utils.worker_start.WorkerStartError: workers would start from the forkserver in a script shape it
            cannot serve (one line saying what to do); at once, and again at ``iter`` if that changed since.
    """
    conf = dataset.conf.dataloader_conf if conf is None else resolve_dataset_conf(conf).dataloader_conf
    kwargs = {"batch_size": None, "num_workers": conf.num_workers, "pin_memory": conf.pin_memory,
              "generator": torch.Generator().manual_seed(dataset.seed)}
    if conf.num_workers > 0:
        kwargs.update(prefetch_factor=conf.prefetch_factor, persistent_workers=conf.persistent_workers,
                      multiprocessing_context=loader_context(dataset),
                      worker_init_fn=functools.partial(start_worker, LogSetup.of_this_process()))
    return _Loader(dataset, **kwargs)


class _Loader(DataLoader):
    """A DataLoader whose workers' start method and logging are chosen when they start (threads may have started,
    and logging been set up, since the loader was built)."""

    def __iter__(self):
        if self.num_workers > 0 and self._iterator is None:
            self.multiprocessing_context = loader_context(self.dataset)
            self.worker_init_fn = functools.partial(start_worker, LogSetup.of_this_process())
        return super().__iter__()


def loader_context(dataset: AsrDataset) -> multiprocessing.context.BaseContext:
    """The multiprocessing context DataLoader workers start in (:func:`toolkit.utils.worker_start.worker_context`):
    ``fork`` while this process runs no other thread and no process group (a user's script or notebook cell
    before it starts any: every script shape works), else a forkserver (every toolkit rank).

    The forkserver imports the toolkit's modules imported so far (and so torch) and the feature libraries
    (``processor.WORKER_IMPORTS``) once, so a worker starts in milliseconds and receives the dataset pickled; it is
    started now, so that its imports overlap with what the caller does before it iterates a loader (the model).

    NOTE: never ``fork`` beside other threads. A training process holds threads (gloo's, tensorboard's writer) and
    a fork while one of them held CPython's thread-state lock leaves the child hung inside ``os.fork()`` for good
    (CPython gh-112275, Python 3.8 to 3.11; seen here as a 2-rank DeepSpeed job that never finished
    cross-validation after a restart: rank 0's loader worker stuck in ``PyOS_AfterFork_Child``, rank 1 waiting in
    the all-reduce). The server is a fresh single-threaded process, so forking it is safe.

    Raises:
        toolkit.utils.worker_start.WorkerStartError: see ``worker_context``.
    """
    context = worker_context(dataset, "loader workers", "set dataset_conf.dataloader_conf.num_workers: 0")
    if context.get_start_method() == "fork":
        for name in processor.WORKER_IMPORTS:  # once here, not in every worker
            importlib.import_module(name)
    else:
        main_name = getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None)
        # NOTE: not the main module itself: a worker runs it again by name, and runpy warns about one already
        # imported
        context.set_forkserver_preload(sorted(name for name in sys.modules
                                              if name.split(".")[0] == "toolkit" and name != main_name)
                                       + list(processor.WORKER_IMPORTS))
        multiprocessing.forkserver.ensure_running()
    return context


def start_worker(log_setup: LogSetup, worker_id: int) -> None:
    """``worker_init_fn`` (with ``log_setup`` bound): log like the process iterating the loader
    (:func:`toolkit.utils.worker_start.start_worker_logging`), and end with it: a thread ends this worker (exit
    status 1) once that process is gone, e.g. a rank killed with SIGKILL.

    NOTE: torch's own watchdog in the worker compares ``os.getppid()`` with its value at start, and a forkserver
    child's parent is the server, which lives while any of its children do: without this thread a dead rank's
    workers, the server and its resource tracker would live on, holding the job's stdout open (``run.sh`` then
    never returned: seen in 3 of 14 stress runs of a killed-and-restarted 2-rank job). ``parent_process()`` is the
    loader's process, whatever the start method.
    """
    start_worker_logging(log_setup)
    sentinel = multiprocessing.parent_process().sentinel
    threading.Thread(target=_exit_when_ready, args=(sentinel,), name="end_with_the_loader", daemon=True).start()


def _exit_when_ready(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)
