"""An exclusive lock on a directory for the process working in it (a training job's global rank 0 in its model dir).

The lock is a POSIX record lock (``fcntl.lockf``) on the file :data:`LOCK_FILE` in the directory, so:

* the kernel drops it when the process ends, however it ends (``kill -9`` included): a killed job never leaves the
  directory locked. Only the file stays, unlocked, and the next job takes it;
* a child of the process (``fork``, a data-loader worker) does not hold it, so a worker that outlives a killed rank
  does not keep the directory locked;
* on NFS it is the server's lock (``lockd``/NFSv4), so jobs on different machines exclude each other too.

The file holds the holder's record (host, pid, the launcher's run id and restart count, when it started), which a
refused job quotes. A clean :meth:`DirLock.release` removes the file, so a job that stops leaves the directory as it
found it. NOTE: removing a lock file is safe only because :meth:`DirLock.acquire` checks, once it holds a lock, that
the path still names the file it locked (another process may have removed it meanwhile), and otherwise tries again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from typing import Any

LOCK_FILE = ".lock"


class DirLock:
    """A lock on ``directory`` (which must exist) with ``record`` (JSON-serialisable) as the holder's description.

    Not re-entrant, and one per process and directory: two POSIX locks of one process on one file are one lock.
    """

    def __init__(self, directory: str, record: dict[str, Any]):
        self.path = os.path.join(directory, LOCK_FILE)
        self.record = record
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> dict[str, Any] | None:
        """Try once, without waiting. Returns None once this process holds the lock, else the holder's record
        (``{}`` if it has not written one yet).

        Raises:
            OSError: the lock file cannot be created or locked for another reason than a holder (a read-only
                directory, a file system without locks).
        """
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise
                holder = _read_record(fd)
                os.close(fd)
                return holder
            if _names(self.path, fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(self.record).encode(), 0)
                self._fd = fd
            else:  # removed (or replaced) by its last holder between our open and our lock: take the new one
                os.close(fd)
        return None

    def release(self) -> None:
        """Remove the lock file and drop the lock (a no-op when not held)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # NOTE: while still held: a process waiting on this file then finds it gone
        os.close(self._fd)
        self._fd = None


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_record(fd: int) -> dict[str, Any]:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # written half-way at this moment
        return {}
    return record if isinstance(record, dict) else {}
