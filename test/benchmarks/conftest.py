"""``benchmarks/harness.py`` importable as ``harness``, the name the benchmark scripts import it by (a script's
folder is first on its ``sys.path``; ``benchmarks/`` is not a package)."""

import importlib.util
import os
import sys

from test.helpers import REPO_ROOT

_PATH = os.path.join(REPO_ROOT, "benchmarks", "harness.py")
_spec = importlib.util.spec_from_file_location("harness", _PATH)
sys.modules["harness"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["harness"])
