"""A new user's install brings everything the product imports: every module of ``toolkit`` imports, and every
command-line tool prints its ``--help``, with only the distributions ``requirements.txt`` declares (an installed but
undeclared one is refused by ``dependency_guard``), each in a fresh interpreter."""

import glob
import os
import subprocess
import sys

import pytest

from test.helpers import REPO_ROOT

from .dependency_guard import GUARD_MESSAGE

# `python -c` in the checkout (cwd) imports this test package first: the guard, then the code under test.
GUARDED = "import sys; from test import dependency_guard; dependency_guard.install(); "
# and the libraries a module imports where first used (the loader's forkserver imports them up front)
IMPORT_ALL = ("import importlib, pkgutil, toolkit\n"
              "for m in pkgutil.walk_packages(toolkit.__path__, 'toolkit.'):\n"
              "    importlib.import_module(m.name)\n"
              "    print(m.name)\n"
              "from toolkit.dataset.processor import WORKER_IMPORTS\n"
              "for name in WORKER_IMPORTS:\n"
              "    importlib.import_module(name)\n")
# benchmarks/harness.py is the scripts' shared module, not a command: the scripts that import it print their help.
TOOLS = sorted(glob.glob(os.path.join(REPO_ROOT, "tools", "*.py"))
               + glob.glob(os.path.join(REPO_ROOT, "benchmarks", "*.py")))
TOOLS.remove(os.path.join(REPO_ROOT, "benchmarks", "harness.py"))
CLIS = ["toolkit.bin.train", "toolkit.bin.recognize", "toolkit.bin.average_model", "toolkit.bin.export"]


def run_guarded(code: str, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", GUARDED + code, *argv], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_every_toolkit_module_imports_with_the_declared_dependencies_only():
    proc = run_guarded(IMPORT_ALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = proc.stdout.split()
    expected = {os.path.relpath(p, REPO_ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                for p in glob.glob(os.path.join(REPO_ROOT, "toolkit", "**", "*.py"), recursive=True)}
    assert set(imported) == expected - {"toolkit"}


@pytest.mark.parametrize("tool", [os.path.relpath(t, REPO_ROOT) for t in TOOLS])
def test_every_tool_prints_its_help_with_the_declared_dependencies_only(tool):
    # As `python tools/x.py` does: the script's folder first on sys.path, then the script as __main__.
    code = ("import os, runpy; sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = run_guarded(code, os.path.join(REPO_ROOT, tool), "--help")
    assert GUARD_MESSAGE not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("cli", CLIS)
def test_every_cli_prints_its_help_with_the_declared_dependencies_only(cli):
    code = "import runpy; sys.argv = [sys.argv[1], '--help']; runpy.run_module(sys.argv[0], run_name='__main__')"
    proc = run_guarded(code, cli)
    assert GUARD_MESSAGE not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


def test_the_guard_refuses_an_installed_but_undeclared_distribution():
    # pip is in every venv and no requirement brings it: a module importing it must fail under the guard.
    proc = run_guarded("import pip")
    assert proc.returncode != 0 and GUARD_MESSAGE in proc.stderr
