"""A command's process collects its garbage once and freezes the rest before the interpreter shuts down
(:func:`toolkit.utils.shutdown.freeze_at_exit`, which each command's ``cli()`` calls first): the shutdown's own
collections would walk torch's objects for 1.5 s on a slow machine. What must still happen at exit does: a file left
open is flushed. Importing the package, or a command's module, changes nothing at exit."""

import subprocess
import sys

import pytest

REPORT_AT_EXIT = """
import atexit, gc, runpy, sys
report, data, module, run = sys.argv[1:5]
# registered first, so atexit runs it last: the last word before the shutdown
atexit.register(lambda: open(report, "w").write(str(gc.get_freeze_count())))
unclosed = open(data, "w")  # frozen too: closed, and so flushed, when the shutdown clears this module
unclosed.write("flushed at shutdown")
if run == "run":  # as `python -m MODULE --help` (the command's cli() runs, then argparse exits)
    sys.argv = [module, "--help"]
    runpy.run_module(module, run_name="__main__")
else:
    __import__(module)
"""


def exit_report(tmp_path, module: str, run: bool) -> tuple[int, str]:
    report, data = tmp_path / "freeze_count", tmp_path / "unclosed.txt"
    proc = subprocess.run([sys.executable, "-c", REPORT_AT_EXIT, str(report), str(data), module,
                           "run" if run else "import"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(report.read_text()), data.read_text()


@pytest.mark.parametrize("command", ["toolkit.bin.train", "toolkit.bin.recognize", "toolkit.bin.average_model"])
def test_a_command_freezes_the_objects_left_at_exit_and_unclosed_files_are_still_flushed(tmp_path, command):
    frozen, data = exit_report(tmp_path, command, run=True)
    assert frozen > 10_000  # torch's modules and functions, exempt from the shutdown's collections
    assert data == "flushed at shutdown"


def test_importing_a_command_module_leaves_the_exit_alone(tmp_path):
    assert exit_report(tmp_path, "toolkit.bin.train", run=False) == (0, "flushed at shutdown")
