import os
import subprocess
import sys

import pytest

from toolkit.utils.kaldi_files import read_table
from toolkit.utils.metrics import ErrorCounts, score

from test.helpers import REPO_ROOT

REF = {"u1": "A B C D", "u2": "THE CAT SAT", "u3": "HELLO"}
HYP = {"u1": "A X C D E", "u2": "THE  SAT", "u9": "EXTRA"}


def compute_wer(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # this checkout's toolkit, whatever is installed
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools/compute_wer.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60, env=env)


def test_word_counts_by_hand():
    result = score(REF, HYP, "word")
    # u1: A=A, B->X (S), C=C, D=D, +E (I); u2: CAT deleted; u3: missing -> HELLO deleted.
    assert result.per_utt["u1"] == ErrorCounts(N=4, C=3, S=1, D=0, I=1)
    assert result.per_utt["u2"] == ErrorCounts(N=3, C=2, S=0, D=1, I=0)
    assert result.per_utt["u3"] == ErrorCounts(N=1, C=0, S=0, D=1, I=0)
    assert result.totals == ErrorCounts(N=8, C=5, S=1, D=2, I=1)
    assert result.totals.error_rate == pytest.approx(50.0)
    assert result.missing == ["u3"] and result.extra == ["u9"]


def test_character_counts_by_hand():
    result = score({"a": "AB C", "b": "CAT"}, {"a": "AC C", "b": "CART"}, "char")
    # a: A=A, B->C (S), " C" equal; b: C A +R T.
    assert result.per_utt["a"] == ErrorCounts(N=4, C=3, S=1, D=0, I=0)
    assert result.per_utt["b"] == ErrorCounts(N=3, C=3, S=0, D=0, I=1)
    assert result.totals.error_rate == pytest.approx(200 / 7)


def test_no_reference_word_has_no_rate():
    assert score({}, {}).totals == ErrorCounts() and score({}, {}).totals.error_rate is None
    only_insertions = score({"a": ""}, {"a": "X"}).totals
    assert only_insertions == ErrorCounts(I=1) and only_insertions.error_rate is None


def test_command_line_report(tmp_path):
    ref, hyp, per_utt = tmp_path / "ref", tmp_path / "hyp", tmp_path / "per_utt"
    ref.write_text("".join(f"{k} {v}\n" for k, v in REF.items()))
    hyp.write_text("".join(f"{k} {v}\n" for k, v in HYP.items()))
    assert read_table(str(hyp)) == {"u1": "A X C D E", "u2": "THE  SAT", "u9": "EXTRA"}
    run = compute_wer(ref, hyp, "--per_utt", per_utt)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["N=8 C=5 S=1 D=2 I=1", "WER 50.00 % [ 4 / 8 ]"]
    assert "u3" in run.stderr and "u9" in run.stderr
    assert per_utt.read_text().splitlines() == ["u1 4 3 1 0 1", "u2 3 2 0 1 0", "u3 1 0 0 1 0"]
    run = compute_wer("--cer", ref, hyp)
    assert run.returncode == 0 and run.stdout.splitlines()[1].startswith("CER ")


def test_an_empty_reference_file_is_an_error(tmp_path):
    (tmp_path / "ref").write_text("\n")
    (tmp_path / "hyp").write_text("u1 A B\n")
    run = compute_wer(tmp_path / "ref", tmp_path / "hyp")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip() == f"compute_wer.py: the reference file {tmp_path / 'ref'} holds no utterance; " \
                                 "nothing to score"


def test_references_without_words_print_counts_and_fail(tmp_path):
    (tmp_path / "ref").write_text("u1\nu2 \n")  # two utterances, both with empty transcripts
    (tmp_path / "hyp").write_text("u1 A B\nu2\n")
    run = compute_wer(tmp_path / "ref", tmp_path / "hyp")
    assert run.returncode == 1
    assert run.stdout.splitlines() == ["N=0 C=0 S=0 D=0 I=2", "WER undefined [ 2 / 0 ]"]
    assert "the 2 references in" in run.stderr and "hold no word: the error rate is undefined" in run.stderr


def test_missing_file_is_named(tmp_path):
    run = compute_wer(tmp_path / "nope", tmp_path / "nope2")
    assert run.returncode == 1 and f"cannot read {tmp_path / 'nope'}" in run.stderr


def test_files_that_would_score_wrongly_are_refused_naming_file_and_line(tmp_path):
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("u1 A B\nu2 C\nu1 D\n")  # a repeated key: which transcript would count?
    hyp.write_text("u1 A B\nu2 C\n")
    run = compute_wer(ref, hyp)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip() == f"compute_wer.py: {ref}:3: key 'u1' repeats line 1"
    ref.write_text("u1 A B\nu2 C\n")
    hyp.write_bytes(b"u1 A B\nu2 \xff\xfe\n")
    run = compute_wer(ref, hyp)
    assert run.returncode == 1 and run.stderr.startswith(f"compute_wer.py: {hyp}:2: not UTF-8 text")
    hyp.write_text("x1 A B\nx2 C\n")  # another test set's hypotheses: every reference would be a deletion
    run = compute_wer(ref, hyp)
    assert run.returncode == 1 and "none of the 2 keys of" in run.stderr and run.stdout == ""
    run = compute_wer(ref, ref, "--per_utt", tmp_path / "no" / "dir")
    assert run.returncode == 1 and "cannot write --per_utt" in run.stderr
