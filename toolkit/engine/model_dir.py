"""A model dir holds one run: which job may write there, what it continues, and what it moves aside first.

A training job claims its ``--model_dir`` (:func:`claim_model_dir`) before it writes anything there:

* **One job at a time.** Global rank 0 locks the dir (:class:`~toolkit.utils.dir_lock.DirLock`, the file ``.lock``)
  for the job's life; a second job on the dir stops in one line naming the holder. The kernel drops the lock of a
  killed job. An elastic restart of the same job (torchrun's ``TORCHELASTIC_RUN_ID``, a higher
  ``TORCHELASTIC_RESTART_COUNT``) whose earlier attempt still shows as the holder waits up to
  :data:`SAME_JOB_WAIT_S` for that lock to go (a machine that died holding an NFS lock keeps it until the server's
  lease ends), where any other job is refused at once.
* **One run per dir.** A dir holds a run when it holds ``train.yaml`` or a committed checkpoint (a ``.pt`` with its
  ``.yaml``). A job continues that run (``--checkpoint auto``: the newest committed ``epoch_N``/``step_N``; or
  ``--checkpoint`` one of its checkpoints, whose later checkpoints, an abandoned continuation, are moved aside), or
  starts over (``--start_over``: everything the dir holds is moved aside). Any other start on a dir holding a run (a
  fresh one, or a resume of a checkpoint from elsewhere) is refused in one line.
* **Aside** is ``<model_dir>/previous_runs/<N>/`` (N = 1, 2, ...): nothing is deleted, and ``average_model.py``,
  ``--checkpoint auto`` and decoding see only the run at the top of the dir.

The claim only reads and locks; moving aside is the job's first write (:meth:`ModelDirClaim.move_aside`), done once
every check of the job has passed (the config, the model against the checkpoint, the world size, the data setup of
a mid-epoch checkpoint), so a refused job leaves the dir as it found it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from toolkit.distributed.collectives import broadcast_object_from_main
from toolkit.distributed.context import DistContext
from toolkit.distributed.shared_dir import check_shared_dir
from toolkit.utils.checkpoint import checkpoint_number, info_path, list_checkpoints, load_info, newest_checkpoint
from toolkit.utils.config_parsing import ConfigError
from toolkit.utils.dir_lock import LOCK_FILE, DirLock

PREVIOUS_RUNS = "previous_runs"
# NOTE: NFSv4 servers keep a dead client's locks for one lease, 90 s by default (nfsd's nfsv4leasetime).
SAME_JOB_WAIT_S = 120.0
# A run holding only these stopped before its first epoch_N or step_N: --checkpoint auto starts it again.
NOTHING_TO_CONTINUE = {"train.yaml", "init.pt"}


@dataclass
class ModelDirClaim:
    """What a job does in its model dir, decided before it writes there (:func:`claim_model_dir`).

    Attributes:
        model_dir: the dir, as given.
        checkpoint: what the job resumes (``--checkpoint auto`` resolved), or None for a fresh start.
        aside: names of the dir's entries to move into ``previous_runs/<N>/`` before the first write.
        reason: why they are moved, for the log.
        lock: the dir's lock on global rank 0 (None on other ranks).
        made: global rank 0 made the dir for this job: a job that stops before its first write removes it again.
    """

    model_dir: str
    checkpoint: str | None
    aside: list[str] = field(default_factory=list)
    reason: str = ""
    lock: DirLock | None = None
    made: bool = False

    def move_aside(self) -> None:
        """Global rank 0 (``run_on_main``): move :attr:`aside` into a new ``previous_runs/<N>/``, logging where."""
        if not self.aside:
            return
        root = os.path.join(self.model_dir, PREVIOUS_RUNS)
        os.makedirs(root, exist_ok=True)
        dest = os.path.join(root, str(1 + max((int(n) for n in os.listdir(root) if n.isdigit()), default=0)))
        os.mkdir(dest)
        for name in self.aside:
            os.rename(os.path.join(self.model_dir, name), os.path.join(dest, name))
        logging.warning("--model_dir %s: moved %s (%s) to %s", self.model_dir, _describe(self.aside), self.reason,
                        dest)

    def release(self) -> None:
        """Unlock the dir (rank 0; a no-op elsewhere and when done already)."""
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> ModelDirClaim:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.release()
        if exc_type is not None and self.made:
            _remove_if_empty(self.model_dir)  # a refused job leaves no trace, not even the dir it made


def claim_model_dir(ctx: DistContext, model_dir: str, checkpoint: str | None, start_over: bool) -> ModelDirClaim:
    """Collective (every rank calls it): lock ``model_dir`` for this job (global rank 0 creates it if missing and
    holds the lock), decide from what it holds what this job resumes and moves aside (:func:`plan_model_dir`), and
    check that every rank sees it (:func:`~toolkit.distributed.shared_dir.check_shared_dir`). Writes nothing but
    the lock file; use it as a context manager, which unlocks at its end.

    Raises:
        ConfigError: on every rank: the dir cannot be made or locked (no permission), is in use by another job,
            holds another run than the one ``checkpoint`` and ``start_over`` say to continue or start, or is not
            shared by every rank.
    """
    lock, claim, made = None, None, False
    if ctx.is_main:
        try:
            made = not os.path.isdir(model_dir)
            os.makedirs(model_dir, exist_ok=True)
            lock = lock_model_dir(ctx, model_dir)
            claim = plan_model_dir(model_dir, checkpoint, start_over,
                                   ctx.run_id if ctx.restart_count > 0 else None)
        except (ConfigError, OSError) as e:
            if lock is not None:
                lock.release()
            if made:
                _remove_if_empty(model_dir)
            claim = str(e) if isinstance(e, ConfigError) else f"--model_dir {model_dir}: {e.strerror} ({e.filename})"
    claim = broadcast_object_from_main(claim, "claim_model_dir")
    if isinstance(claim, str):
        raise ConfigError(claim)
    claim.lock, claim.made = lock, made
    try:
        check_shared_dir(model_dir, "--model_dir")  # NOTE: after the lock: one job's marker in the dir at a time
    except BaseException as e:
        claim.__exit__(type(e), e, None)
        raise
    return claim


def _remove_if_empty(model_dir: str) -> None:
    with contextlib.suppress(OSError):  # not empty (or gone): what is there stays
        os.rmdir(model_dir)


def lock_model_dir(ctx: DistContext, model_dir: str) -> DirLock:
    """Lock ``model_dir`` (which exists) for this job; an elastic restart of the job whose earlier attempt still
    shows as the holder waits for it up to :data:`SAME_JOB_WAIT_S`.

    Raises:
        ConfigError: another job holds it (naming its host, pid, run id and start).
    """
    lock = DirLock(model_dir, {**_record("training"), "run_id": ctx.run_id, "restart_count": ctx.restart_count})
    holder = lock.acquire()
    if holder is not None and _earlier_attempt(holder, ctx):
        logging.info("--model_dir %s is still locked by attempt %s of this job (%s); waiting up to %.0f s for it",
                     model_dir, holder.get("restart_count"), _who(holder), SAME_JOB_WAIT_S)
        deadline = time.monotonic() + SAME_JOB_WAIT_S
        while holder is not None and time.monotonic() < deadline:
            time.sleep(1.0)
            holder = lock.acquire()
    if holder is not None:
        raise ConfigError(f"--model_dir {model_dir} is in use by another {holder.get('command', 'training')} job "
                          f"({_who(holder)}); wait for it to end, or train into another --model_dir")
    return lock


def lock_for_averaging(model_dir: str) -> DirLock | None:
    """Lock ``model_dir`` (which exists) for ``average_model.py``, which reads its epoch checkpoints and writes
    ``avg_N.pt`` beside them: refused while a training job holds it (its epochs are still being written, and the
    best ones may not be there yet), and a training job started meanwhile is refused in turn. Decoding takes no
    lock: it reads one committed checkpoint and writes only into its own ``--result_dir``.

    Returns:
        The lock (release it when the average is written), or None where the dir is read-only to this user (no job
        of this user can write there either).

    Raises:
        ConfigError: a job holds the dir (naming it, its pid, host and start).
    """
    lock = DirLock(model_dir, _record("averaging"))
    try:
        holder = lock.acquire()
    except PermissionError:
        return None
    except OSError as e:
        if e.errno == errno.EROFS:
            return None
        raise ConfigError(f"--src_path {model_dir}: {e.strerror} ({e.filename})") from None
    if holder is not None:
        raise ConfigError(f"--src_path {model_dir} is in use by a {holder.get('command', 'training')} job "
                          f"({_who(holder)}): average its epochs once it has ended (they are still being written)")
    return lock


def _record(command: str) -> dict[str, Any]:
    """What a lock's holder writes in the lock file, for a refused job to quote."""
    return {"command": command, "host": socket.gethostname(), "pid": os.getpid(),
            "since": datetime.datetime.now().isoformat(timespec="seconds")}


def plan_model_dir(model_dir: str, checkpoint: str | None, start_over: bool,
                   restart_of: str | None = None) -> ModelDirClaim:
    """What a job does with the run ``model_dir`` holds: the checkpoint it resumes and the entries it moves aside.

    Args:
        checkpoint: ``--checkpoint``: None (a fresh start), ``"auto"`` or a path.
        start_over: ``--start_over``: move everything the dir holds aside (with ``"auto"``: unless ``restart_of``
            started the run there, which it then continues).
        restart_of: the run id of the elastic job this process restarts (None in a first attempt).

    Raises:
        ConfigError: the dir holds another run than the one to continue, and ``start_over`` is not given.
    """
    names = sorted(set(os.listdir(model_dir)) - {LOCK_FILE, PREVIOUS_RUNS})
    run = _run_files(names)
    if start_over and checkpoint == "auto" and restart_of is not None and _run_id(model_dir) == restart_of:
        start_over = False  # an elastic restart of the job that started over: its own run, continued
    if start_over:
        return ModelDirClaim(model_dir, None if checkpoint == "auto" else checkpoint, names, "--start_over")
    problem = ""
    if checkpoint == "auto":
        newest = newest_checkpoint(model_dir)
        if newest is not None or set(run) <= NOTHING_TO_CONTINUE:
            return ModelDirClaim(model_dir, newest)
        problem = " with no epoch_N.pt or step_N.pt to continue from"
    elif checkpoint is not None and _same_dir(os.path.dirname(checkpoint) or ".", model_dir):
        return ModelDirClaim(model_dir, checkpoint, _later_than(checkpoint, model_dir),
                             f"trained after --checkpoint {checkpoint}, which this run continues")
    elif not run:
        return ModelDirClaim(model_dir, checkpoint)
    elif checkpoint is not None:
        problem = f", not the run of --checkpoint {checkpoint}"
    continue_it = "" if checkpoint == "auto" else "continue it with --checkpoint auto, "
    raise ConfigError(f"--model_dir {model_dir} holds an earlier run ({_describe(run)}){problem}: {continue_it}start "
                      f"a new one there with --start_over (run.sh: --start_over true), which moves the old one into "
                      f"{os.path.join(model_dir, PREVIOUS_RUNS)}/, or train into another --model_dir (run.sh: --dir)")


def _run_files(names: list[str]) -> list[str]:
    """Of a dir's entries, those that make it hold a run: committed checkpoints (``.pt`` + ``.yaml``), train.yaml."""
    committed = [n for n in names if n.endswith(".pt") and n[:-3] + ".yaml" in names]
    committed.sort(key=lambda n: (re.sub(r"\d+\.pt$", "", n), checkpoint_number(n)))
    return committed + [n for n in names if n == "train.yaml"]


def _later_than(checkpoint: str, model_dir: str) -> list[str]:
    """The files of the committed ``epoch_N``/``step_N`` checkpoints of ``model_dir`` that training reached after
    ``checkpoint`` (the order of :func:`~toolkit.utils.checkpoint.newest_checkpoint`): ``.pt``, ``.yaml`` and a
    DeepSpeed shard dir."""
    def reached(path: str) -> tuple[int, bool]:
        return load_info(path).get("step", -1), os.path.basename(path).startswith("epoch_")

    if not os.path.exists(info_path(checkpoint)):
        return []  # not committed: the resume refuses it
    mine = reached(checkpoint)
    later = [p for prefix in ("epoch_", "step_") for p in list_checkpoints(model_dir, prefix)
             if reached(p) > mine]
    tags = [os.path.basename(p)[:-3] for p in later]
    return [name for tag in tags for name in (f"{tag}.pt", f"{tag}.yaml", tag)
            if os.path.lexists(os.path.join(model_dir, name))]


def _run_id(model_dir: str) -> str | None:
    """The torchrun run id of the job that started the dir's run (its ``init.yaml``), if any."""
    path = os.path.join(model_dir, "init.yaml")
    return load_info(path).get("run_id") if os.path.exists(path) else None


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _earlier_attempt(holder: dict[str, Any], ctx: DistContext) -> bool:
    """Whether the lock's holder is an earlier attempt of this elastic job (torchrun ends it before restarting)."""
    return (ctx.run_id is not None and holder.get("run_id") == ctx.run_id
            and isinstance(holder.get("restart_count"), int) and holder["restart_count"] < ctx.restart_count)


def _who(holder: dict[str, Any]) -> str:
    if not holder:
        return "it is starting"
    run = f", torchrun run id {holder['run_id']}" if holder.get("run_id") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{run}, since {holder.get('since')}"


def _describe(names: list[str]) -> str:
    shown = ", ".join(names[:4])
    return f"{shown}, ... ({len(names)} files)" if len(names) > 4 else shown
