"""The DataLoader's workers (toolkit/dataset/loader.py): started from a forkserver beside other threads, ended with
their loader's process."""
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolkit.dataset import build_dataloader, build_dataset
from toolkit.dataset.data_list import make_raw_list, write_raw_list

from test.helpers import REPO_ROOT, alive, kill, outlived

FSDD = REPO_ROOT / "corpora/tiny_fsdd"


def fsdd_list(folder: Path, num_lines: int):
    """A raw list of tiny_fsdd's first ``num_lines`` training utterances without a Z (the tokenizer has none) in
    ``folder``: its path and keys."""
    split = FSDD / "data" / "train"
    entries = [e for e in make_raw_list(str(split / "wav.scp"), str(split / "text"), str(FSDD))[0]
               if "Z" not in e["txt"]][:num_lines]
    write_raw_list(entries, str(folder / "data.list"))
    return str(folder / "data.list"), [e["key"] for e in entries]


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_loader_workers_are_not_forked_from_a_process_whose_native_threads_enter_python(tmp_path, tokenizer):
    # The case: a native thread entering Python (as gloo's threads do in a trainer) holds CPython's thread-state
    # lock for an instant each time; a child forked at that instant hangs inside os.fork() for good (CPython
    # gh-112275, Python 3.8-3.11; a plain os.fork() beside this very thread hung 3 times in 2,000 here, and a
    # resumed 2-rank job's cross-validation loader hung so in CI). The workers come from the forkserver instead:
    # none is this process's child, and every pass ends (SIGALRM fails the test in place of a hang).
    libc = ctypes.CDLL(None)
    entry = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda arg: None)
    stop = threading.Event()

    def native_threads_entering_python():
        tid = ctypes.c_ulong()
        while not stop.is_set():
            libc.pthread_create(ctypes.byref(tid), None, entry, None)
            libc.pthread_join(tid, None)

    def hung(signum, frame):
        raise TimeoutError("a DataLoader pass did not end within 120 s")

    data_list, keys = fsdd_list(tmp_path, 2)
    dataset = build_dataset(data_list, tokenizer, {"sort": False, "dataloader_conf": {"num_workers": 1}}, mode="cv")
    loader = build_dataloader(dataset)
    hammer = threading.Thread(target=native_threads_entering_python, daemon=True)
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    hammer.start()
    try:
        for _ in range(20):
            it = iter(loader)
            first = next(it)
            assert {_parent_pid(worker.pid) for worker in it._workers}.isdisjoint({os.getpid()})
            assert first["keys"] + [key for batch in it for key in batch["keys"]] == keys
    finally:
        stop.set()
        hammer.join(timeout=10)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


LOADER_THEN_SLEEP = """
import sys, threading, time
from toolkit.dataset import build_dataloader, build_dataset
from toolkit.text.tokenizer import CharTokenizer
if __name__ == "__main__":
    if sys.argv[3] == "rank":  # another thread, as a rank has: the workers start from the forkserver
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    # batches of 1 and 2 in flight per worker: neither worker can run out (and exit) before the kill
    conf = {"batch_conf": {"batch_size": 1}, "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}}
    dataset = build_dataset(sys.argv[1], CharTokenizer(sys.argv[2]), conf, mode="cv")
    it = iter(build_dataloader(dataset))
    next(it)
    print(*[worker.pid for worker in it._workers], flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("shape", ["rank", "script"])
def test_loader_workers_end_when_the_process_iterating_them_is_killed(tmp_path, tokenizer, shape):
    # The case: a rank killed with SIGKILL mid-epoch. torch's watchdog in a worker watches its parent pid, which
    # for a forkserver child is the server; without start_worker's thread the workers (and the server) lived on.
    # A script without other threads forks its workers.
    data_list, _ = fsdd_list(tmp_path, 12)
    script = tmp_path / "loader_then_sleep.py"
    script.write_text(LOADER_THEN_SLEEP)
    stderr = tmp_path / "stderr.txt"  # also its resource tracker's (it reports the semaphores the kill leaked)
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, str(script), data_list, tokenizer.symbol_table_path, shape],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(map(alive, workers)), stderr.read_text()[-3000:]
        # children of the forkserver beside another thread, else forked
        assert [_parent_pid(pid) == proc.pid for pid in workers] == [shape == "script"] * 2
        assert not outlived(workers, kill(proc), 30), "a worker outlived the process that iterated its loader"
    finally:
        proc.kill()


LOG_SKIPS = """
import collections, json, logging, sys, threading
from toolkit.dataset import build_dataloader, build_dataset
from toolkit.text.tokenizer import CharTokenizer
if __name__ == "__main__":
    data_list, table, num_workers, start, log = sys.argv[1:]
    if start == "forkserver":  # another thread, as a rank has
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank0 %(levelname)s %(message)s",
                        handlers=[logging.FileHandler(log), logging.StreamHandler()])
    conf = {"batch_conf": {"batch_size": 2}, "dataloader_conf": {"num_workers": int(num_workers)}}
    report = {}
    for mode in ("train", "cv", "test"):
        loader = build_dataloader(build_dataset(data_list, CharTokenizer(table), conf, mode=mode))
        skipped, keys = collections.Counter(), []
        for batch in loader:
            skipped.update(batch["num_skipped"])
            keys += batch["keys"]
        method = loader.multiprocessing_context.get_start_method() if loader.num_workers else None
        report[mode] = {"skipped": skipped, "keys": sorted(keys), "start": method}
        logging.info("end of %s", mode)
    print(json.dumps(report))
"""


@pytest.mark.parametrize("num_workers,start", [(0, None), (1, "fork"), (2, "fork"), (1, "forkserver"),
                                               (2, "forkserver")])
def test_every_skipped_utterance_is_named_once_in_the_log_whatever_the_workers(tmp_path, tokenizer, num_workers,
                                                                               start):
    # The case: a test list whose FIRST line's audio is missing; the count was right, but the workers (started from
    # the forkserver in every rank) had no log handler, so their skip lines bypassed the log's format (time, rank,
    # level) and its file. Each skip is now one line of the main process's format, in each of its destinations, in
    # training, CV and decoding alike.
    data_list, keys = fsdd_list(tmp_path, 8)
    lines = Path(data_list).read_text().splitlines()
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt not audio")
    bad = {0: ("missing_audio", tmp_path / "gone_first.wav"), 4: ("unreadable_audio", tmp_path / "corrupt.wav"),
           7: ("missing_audio", tmp_path / "gone_last.wav")}
    for index, (_, wav) in bad.items():
        lines[index] = lines[index].replace(json.loads(lines[index])["wav"], str(wav))
    Path(data_list).write_text("\n".join(lines) + "\n")
    script, log = tmp_path / "log_skips.py", tmp_path / "run.log"
    script.write_text(LOG_SKIPS)
    proc = subprocess.run([sys.executable, str(script), data_list, tokenizer.symbol_table_path, str(num_workers),
                           str(start), str(log)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    expected_skips = {"missing_audio": 2, "unreadable_audio": 1}
    good = sorted(key for index, key in enumerate(keys) if index not in bad)
    for mode, seen in report.items():
        assert seen == {"skipped": expected_skips, "keys": good, "start": start}, mode
    in_file = log.read_text().splitlines()
    in_stderr = [line for line in proc.stderr.splitlines() if " rank0 " in line]
    assert sorted(in_file) == sorted(in_stderr)  # two workers' lines may interleave differently in each
    modes = [[]]
    for line in in_file:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} rank0 (INFO|WARNING) .*", line), line
        modes[-1].append(line) if " end of " not in line else modes.append([])
    assert len(modes) == 4 and modes[-1] == []
    for mode_lines in modes[:3]:
        named = sorted(re.search(r"WARNING skipping utterance (\S+): (\w+) ", line).groups()
                       for line in mode_lines if "skipping utterance" in line)
        assert named == sorted((keys[index], reason) for index, (reason, _) in bad.items())
    # nothing of a worker bypassed the format (Python's last-resort handler writes the message alone)
    assert not [line for line in proc.stderr.splitlines() if line.startswith("skipping")]
