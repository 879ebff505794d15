"""tools/results_table.py: the full-context table, and the streaming table's rates per decoding_chunk_size, each
the scorer's (toolkit.utils.metrics) on the hypotheses run.sh's stage 5 writes for that chunk size."""
import os
import subprocess
import sys

from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import score

from test.helpers import REPO_ROOT, kaldi_entries


def write_text(path, rows: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key} {text}\n" for key, text in rows.items()))


def test_streaming_table_reads_each_chunk_sizes_hypotheses(tmp_path):
    refs = {e["key"]: e["txt"] for e in kaldi_entries("tiny_lj", "test")}
    write_text(tmp_path / "data" / "test_lj" / "text", refs)
    keys = sorted(refs)
    # full context: every transcript right; chunk 16: the first utterance's last word dropped; chunk 4: no hypothesis
    # for the second utterance (counted as deletions)
    hyps = {-1: dict(refs), 16: {**refs, keys[0]: refs[keys[0]].rsplit(" ", 1)[0]},
            4: {key: text for key, text in refs.items() if key != keys[1]}}
    for chunk, rows in hyps.items():
        sub = "test_lj" if chunk == -1 else f"test_lj/chunk_{chunk}"
        write_text(tmp_path / "exp" / sub / "ctc_greedy_search" / "text", rows)
    out = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "results_table.py"), "--data",
                          str(tmp_path / "data"), "--dir", str(tmp_path / "exp"), "--test_sets", "test_lj", "--modes",
                          "ctc_greedy_search", "--decoding_chunk_sizes", "-1", "16", "4"],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).stdout
    ref_table = read_table(str(tmp_path / "data" / "test_lj" / "text"), text=True)
    rates = [score(ref_table, hyps[chunk], unit).totals.error_rate for chunk in (-1, 16, 4) for unit in ("word", "char")]
    assert rates[0] == rates[1] == 0.0 and 0 < rates[2] < rates[4]  # chunk 4 lost a whole utterance
    words = score(ref_table, hyps[-1], "word").totals.N
    assert f"| test_lj | ctc_greedy_search | {len(refs)} | {words} | 0.00 (0/0/0) | 0.00 |" in out
    assert "| test set | decoding mode | full context | chunk 16 | chunk 4 |" in out
    assert ("| test_lj | ctc_greedy_search | " + " | ".join(f"{rates[i]:.2f} / {rates[i + 1]:.2f}" for i in (0, 2, 4))
            + " |") in out
