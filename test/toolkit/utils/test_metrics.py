import random

import pytest

from toolkit.utils.metrics import ErrorCounts, format_report, sum_counts, utterance_counts

REFS = ["THE CAT SAT ON THE MAT", "HELLO", "A B C D E F G H", "ONE TWO", "YES"]
HYPS = ["THE CAT SAT ON MAT", "HELLO WORLD", "A X C D E F G H", "", "NO"]


def test_partial_sums_equal_the_whole_and_partial_rates_do_not():
    whole = sum_counts(utterance_counts(REFS, HYPS))
    assert whole == ErrorCounts(N=18, C=13, S=2, D=3, I=1)  # by hand: 1 D; 1 I; 1 S; 2 D; 1 S
    order = list(range(len(REFS)))
    random.Random(0).shuffle(order)
    parts = [order[:1], order[1:]]  # two "ranks" of very different sizes
    partial = [sum_counts(utterance_counts([REFS[i] for i in p], [HYPS[i] for i in p])) for p in parts]
    assert partial[0] + partial[1] == whole
    mean_of_rates = sum(c.error_rate for c in partial) / len(partial)
    assert whole.error_rate == pytest.approx(100 * 6 / 18) and mean_of_rates != pytest.approx(whole.error_rate)


def test_whitespace_is_normalised_and_characters_include_the_word_space():
    assert utterance_counts(["  A   B "], ["A B"]) == [ErrorCounts(N=2, C=2)]
    assert utterance_counts(["AB C"], ["ABC"], "char") == [ErrorCounts(N=4, C=3, D=1)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unit must be one of"):
        utterance_counts(["A"], ["A"], "phone")
    with pytest.raises(ValueError, match="1 references but 2 hypotheses"):
        utterance_counts(["A"], ["A", "B"])
    assert utterance_counts([], []) == []


def test_report_format():
    assert format_report(ErrorCounts(N=8, C=5, S=1, D=2, I=1)) == "N=8 C=5 S=1 D=2 I=1\nWER 50.00 % [ 4 / 8 ]\n"
    assert format_report(ErrorCounts(N=3, C=3), "char").splitlines()[1] == "CER 0.00 % [ 0 / 3 ]"
    assert format_report(ErrorCounts(I=2)).splitlines()[1] == "WER undefined [ 2 / 0 ]"
