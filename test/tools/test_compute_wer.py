import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from compute_wer import read_table, score  # noqa: E402

REF = {"u1": "A B C D", "u2": "THE CAT SAT", "u3": "HELLO"}
HYP = {"u1": "A X C D E", "u2": "THE  SAT", "u9": "EXTRA"}


def test_word_counts_by_hand():
    result = score(REF, HYP, cer=False)
    # u1: A=A, B->X (S), C=C, D=D, +E (I); u2: CAT deleted; u3: missing -> HELLO deleted.
    assert result["per_utt"]["u1"] == {"N": 4, "C": 3, "S": 1, "D": 0, "I": 1}
    assert result["per_utt"]["u2"] == {"N": 3, "C": 2, "S": 0, "D": 1, "I": 0}
    assert result["per_utt"]["u3"] == {"N": 1, "C": 0, "S": 0, "D": 1, "I": 0}
    assert {c: result[c] for c in "NCSDI"} == {"N": 8, "C": 5, "S": 1, "D": 2, "I": 1}
    assert result["error_rate"] == pytest.approx(50.0)
    assert result["missing"] == ["u3"] and result["extra"] == ["u9"]


def test_character_counts_by_hand():
    result = score({"a": "AB C", "b": "CAT"}, {"a": "AC C", "b": "CART"}, cer=True)
    # a: A=A, B->C (S), " C" equal; b: C A +R T.
    assert result["per_utt"]["a"] == {"N": 4, "C": 3, "S": 1, "D": 0, "I": 0}
    assert result["per_utt"]["b"] == {"N": 3, "C": 3, "S": 0, "D": 0, "I": 1}
    assert result["error_rate"] == pytest.approx(200 / 7)


def test_empty_reference_set():
    assert score({}, {}, cer=False)["error_rate"] == 0.0
    assert score({"a": ""}, {"a": "X"}, cer=False)["I"] == 1


def test_command_line_report(tmp_path):
    ref, hyp, per_utt = tmp_path / "ref", tmp_path / "hyp", tmp_path / "per_utt"
    ref.write_text("".join(f"{k} {v}\n" for k, v in REF.items()))
    hyp.write_text("".join(f"{k} {v}\n" for k, v in HYP.items()))
    assert read_table(str(hyp)) == {"u1": "A X C D E", "u2": "THE  SAT", "u9": "EXTRA"}
    run = subprocess.run([sys.executable, str(ROOT / "tools/compute_wer.py"), str(ref), str(hyp),
                          "--per_utt", str(per_utt)], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == ["N=8 C=5 S=1 D=2 I=1", "WER 50.00 % [ 4 / 8 ]"]
    assert "u3" in run.stderr and "u9" in run.stderr
    assert per_utt.read_text().splitlines() == ["u1 4 3 1 0 1", "u2 3 2 0 1 0", "u3 1 0 0 1 0"]
