"""The documents cite what exists: every test named in docs/distributed.md is a test in this suite."""

import glob
import os
import re

from test.helpers import REPO_ROOT


def test_every_test_cited_in_the_distributed_rules_exists():
    tests = {}
    for path in glob.glob(os.path.join(REPO_ROOT, "test", "**", "test_*.py"), recursive=True):
        names = set(re.findall(r"^def (test_\w+)", open(path, encoding="utf-8").read(), re.M))
        tests[os.path.relpath(path, REPO_ROOT)] = names
    doc = open(os.path.join(REPO_ROOT, "docs", "distributed.md"), encoding="utf-8").read()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and not line.startswith("| rule")]
    assert len(rows) > 20
    for row in rows:
        cited = row.rsplit("|", 2)[-2]
        current_file = None
        names = re.findall(r"`((?:test/[\w/]+/)?(test_\w+)\.py)::(test_\w+)|`(test_\w+)(?:\[|`| )", cited)
        assert names, f"row cites no test: {row[:80]}"
        for path, module, name, bare in names:
            if path:
                current_file = path if path.startswith("test/") else os.path.join("test", "multiprocess", path)
                assert name in tests[current_file], f"{current_file}::{name}"
            else:  # a further test of the file named before it in the row
                assert current_file and bare in tests[current_file], f"{current_file}::{bare}"
