"""benchmarks/bench_ctc_search.py: a revision's child times the search on the posteriors the parent made, and the
table says that the whole-utterance and chunk-by-chunk n-bests agree."""

import subprocess
import sys

import pytest

from test.helpers import REPO_ROOT

pytestmark = pytest.mark.multiprocess  # the parent and a child process per revision, each importing torch


def test_the_table_has_every_length_and_the_chunked_n_best_agrees(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_ctc_search.py"), "--revs", "worktree",
                           "--out_dir", str(tmp_path), "--lengths", "40", "80", "--beam", "4", "--chunk", "3",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["no"], ["yes"])]
    assert [(row[0], row[1], row[2]) for row in rows] == [(lm, t, "worktree") for lm in ("no", "yes")
                                                           for t in ("40", "80")]
    for row in rows:  # LM T revision ms/frame growth ratio chunked same
        assert float(row[3]) > 0 and float(row[5]) == 1.0 and float(row[6]) > 0 and row[7] == "yes", row
