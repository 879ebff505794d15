"""Data flows one way: the import contract in ``.importlinter`` (checked by import-linter) holds, and the scripts
in ``tools/`` and ``benchmarks/`` reach the code only through the installed package (no ``sys.path`` edits, no imports
of each other), except that the benchmark scripts share ``benchmarks/harness.py``, kept out of the package."""

import ast
import glob
import os
import subprocess
import sys

from test.helpers import REPO_ROOT
HARNESS = "harness"  # benchmarks/harness.py


def test_the_import_contract_is_kept():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    proc = subprocess.run([lint, "--config", os.path.join(REPO_ROOT, ".importlinter")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    print(proc.stdout[-2000:])
    assert proc.returncode == 0 and "2 kept, 0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_tools_import_only_the_package():
    tools = sorted(glob.glob(os.path.join(REPO_ROOT, "tools", "*.py"))
                   + glob.glob(os.path.join(REPO_ROOT, "benchmarks", "*.py")))
    names = {os.path.basename(t)[:-3] for t in tools}
    for path in tools:
        source = open(path, encoding="utf-8").read()
        assert "sys.path" not in source, f"{path} edits sys.path; import the installed package instead"
        shared = {HARNESS} if os.path.basename(os.path.dirname(path)) == "benchmarks" else set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for module in modules:
                    assert module.split(".")[0] not in names - shared, f"{path} imports the tool {module}"
