"""A process that imported the toolkit collects its garbage once and freezes the rest just before the interpreter
shuts down (``toolkit._collect_then_freeze``): the shutdown's own collections would walk torch's objects for 1.5 s
on a slow machine. What must still happen at exit does: a file left open is flushed."""

import subprocess
import sys

EXIT_THEN_REPORT = """
import atexit, gc, sys
# registered before the toolkit's handler, so atexit runs it after that one: the last word before shutdown
atexit.register(lambda: open(sys.argv[1], "w").write(str(gc.get_freeze_count())))
import toolkit.bin.train
unclosed = open(sys.argv[2], "w")  # frozen too: closed, and so flushed, when the shutdown clears this module
unclosed.write("flushed at shutdown")
"""


def test_the_last_exit_step_freezes_the_objects_left_and_unclosed_files_are_still_flushed(tmp_path):
    report, data = tmp_path / "freeze_count", tmp_path / "unclosed.txt"
    proc = subprocess.run([sys.executable, "-c", EXIT_THEN_REPORT, str(report), str(data)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(report.read_text()) > 10_000  # torch's modules and functions, exempt from the shutdown's collections
    assert data.read_text() == "flushed at shutdown"
