"""The check that every rank sees the directory global rank 0 writes shared artifacts to (the model dir).

Checkpoints, ``train.yaml`` and tensorboard logs are written by global rank 0 alone, and every rank loads them back
(resume, DeepSpeed's per-rank shards beside them). On several machines that only works when the model dir is on a
disk every node mounts; a node-local directory at the same path would otherwise show up much later, as a resume
that finds no shards or a node that trains from its own stale files. Checked once at start: rank 0 writes a marker
holding a token drawn for this run (so a marker left by an earlier run on a node-local disk does not pass), every
rank reads it, and the answers are gathered.
"""

from __future__ import annotations

import os
import secrets
import socket

from toolkit.distributed.collectives import all_gather_objects, broadcast_object_from_main
from toolkit.distributed.main_only import is_main_process, run_on_main
from toolkit.utils.config_parsing import ConfigError

MARKER = ".shared_dir_check"


def _write_marker(path: str, token: str) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, MARKER), "w", encoding="utf-8") as f:
        f.write(token)


def _sees_marker(path: str, token: str) -> bool:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            return f.read() == token
    except OSError:
        return False


def check_shared_dir(path: str, option: str) -> None:
    """Collective (every rank calls it): return when every rank sees the files global rank 0 writes in ``path``.

    ``path`` is created by rank 0 if missing; the marker is removed again before returning. Without a process group
    (or on one rank) it only creates ``path``.

    Raises:
        ConfigError: on every rank, naming the ranks and hosts that do not see it (``option`` names the setting,
            e.g. ``--model_dir``).
    """
    token = broadcast_object_from_main(secrets.token_hex(16), "check_shared_dir token")
    run_on_main(_write_marker, (path, token))
    seen = all_gather_objects((socket.gethostname(), _sees_marker(path, token)), "check_shared_dir")
    if is_main_process():
        os.unlink(os.path.join(path, MARKER))
    blind = [f"rank {rank} ({host})" for rank, (host, ok) in enumerate(seen) if not ok]
    if blind:
        raise ConfigError(f"{option} {path} is not shared: {', '.join(blind)} cannot see the file global rank 0 "
                          f"({seen[0][0]}) wrote there; put it on a disk every node mounts at the same path (e.g. "
                          "NFS), since checkpoints are written by rank 0 and read back by every rank")
