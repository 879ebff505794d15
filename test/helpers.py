"""What the tests and their worker scripts share: where the checkout is, the tiny corpora's Kaldi entries, a free
TCP port, and the rank reports through which each rank of a worker script tells its test what it saw.

Imported as ``test.helpers`` (``test`` is a package): pytest puts the checkout first on ``sys.path`` when it loads
``test/conftest.py``, and worker scripts find it on the ``PYTHONPATH`` their launcher sets
(``test/multiprocess/workers/launch.py``). Kept to the standard library, so that a worker pays nothing to import it.
"""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout: run.sh, toolkit/, tools/, corpora/, examples/


def kaldi_entries(corpus: str | os.PathLike, split: str) -> list[dict]:
    """The Kaldi directory ``<corpus>/data/<split>`` (``wav.scp`` and ``text``) as data.list entries
    ``{"key", "wav" (absolute path), "txt"}``, in key order.

    Args:
        corpus: a corpus name under ``corpora/`` (``"tiny_fsdd"``) or a corpus directory.
        split: ``"train"``, ``"dev"`` or ``"test"``.
    """
    root = REPO_ROOT / "corpora" / corpus

    def read(name: str) -> dict[str, str]:
        with open(root / "data" / split / name, encoding="utf-8") as f:
            return dict(line.rstrip("\n").split(" ", 1) for line in f)

    wavs, texts = read("wav.scp"), read("text")
    return [{"key": key, "wav": str(root / wavs[key]), "txt": texts[key]} for key in sorted(wavs)]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now, for a rendezvous endpoint (free when asked, not reserved)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """Where rank ``rank`` of a worker script writes its report: ``out_dir/rank{rank}.json``."""
    return Path(out_dir) / f"rank{rank}.json"


def write_rank_report(out_dir: str | os.PathLike, rank: int, report) -> None:
    """Worker side: ``report`` (JSON-serialisable) as rank ``rank``'s report in ``out_dir``."""
    with open(_report_path(out_dir, rank), "w", encoding="utf-8") as f:
        json.dump(report, f)


def read_rank_reports(out_dir: str | os.PathLike, world_size: int) -> list:
    """Test side: the reports of ranks ``0 .. world_size - 1`` in ``out_dir``, in rank order.

    Raises:
        FileNotFoundError: a rank wrote no report (it failed or never got there); the path names the rank.
    """
    reports = []
    for rank in range(world_size):
        with open(_report_path(out_dir, rank), encoding="utf-8") as f:
            reports.append(json.load(f))
    return reports


def descendants(pid: int) -> set[int]:
    """The live processes under ``pid`` (by their parent pids in /proc; torchrun's ranks run in sessions of their
    own, so a process group would miss them)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):  # ended meanwhile
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie, whose end its dead parent's reaper has not collected yet, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill(proc: subprocess.Popen) -> float:
    """SIGKILL ``proc`` and reap it; returns when (``time.monotonic``), for :func:`outlived`."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return time.monotonic()


def outlived(pids, since: float, within_s: float) -> list[int]:
    """Those of ``pids`` still running ``within_s`` seconds after ``since`` (``time.monotonic``), waiting for them
    until then."""
    while any(alive(pid) for pid in pids) and time.monotonic() - since < within_s:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def kill_all(proc: subprocess.Popen, pids) -> None:
    """SIGKILL ``proc`` and every one of ``pids`` still running: no orphan of a failed test outlives it."""
    proc.kill()
    proc.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
