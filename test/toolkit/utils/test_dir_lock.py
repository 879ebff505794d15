"""toolkit.utils.dir_lock: a directory lock that another process cannot take, that a killed holder does not leave
stuck, that a holder's forked child (a data-loader worker outliving its rank) does not keep, and whose clean release
leaves the directory as it was. The holders are real processes: two locks of one process are one POSIX lock."""

import json
import os
import signal
import subprocess
import sys

from toolkit.utils.dir_lock import LOCK_FILE, DirLock

HOLD = """
import os, sys, time
from toolkit.utils.dir_lock import DirLock
lock = DirLock(sys.argv[1], {"pid": os.getpid(), "who": "holder"})
assert lock.acquire() is None
if sys.argv[2] == "fork":  # a child that outlives its parent, as a loader worker may outlive a killed rank
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print("locked", child, flush=True)
    os._exit(0)  # the parent ends without releasing: only the kernel drops its lock
print("locked", os.getpid(), flush=True)
time.sleep(60)
"""


def hold(directory, mode="hold") -> tuple[subprocess.Popen, int]:
    """A process holding the lock of ``directory``, and the pid that sleeps on (the holder, or its child)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), mode], stdout=subprocess.PIPE, text=True)
    word, pid = proc.stdout.readline().split()
    assert word == "locked"
    return proc, int(pid)


def test_a_held_lock_refuses_with_the_holders_record_and_a_killed_holder_leaves_it_free(tmp_path):
    holder, _ = hold(tmp_path)
    try:
        assert DirLock(str(tmp_path), {"who": "second"}).acquire() == {"pid": holder.pid, "who": "holder"}
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert (tmp_path / LOCK_FILE).exists()  # left by the killed holder, unlocked
    lock = DirLock(str(tmp_path), {"who": "third"})
    assert lock.acquire() is None and lock.held
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == {"who": "third"}
    lock.release()
    assert os.listdir(tmp_path) == [] and not lock.held


def test_a_forked_child_of_the_holder_does_not_keep_the_lock(tmp_path):
    holder, child = hold(tmp_path, "fork")
    holder.wait(timeout=30)  # the parent is gone, its child sleeps on, holding the lock file open
    lock = DirLock(str(tmp_path), {"who": "next"})
    try:
        os.kill(child, 0)  # still alive
        assert lock.acquire() is None
    finally:
        lock.release()
        os.kill(child, signal.SIGKILL)


def test_a_released_lock_is_taken_again_by_the_next_process(tmp_path):
    first = DirLock(str(tmp_path), {"who": "first"})
    assert first.acquire() is None
    first.release()
    first.release()  # a no-op once released
    holder, _ = hold(tmp_path)
    try:
        assert DirLock(str(tmp_path), {}).acquire() == {"pid": holder.pid, "who": "holder"}
    finally:
        holder.kill()
        holder.wait(timeout=30)

