"""Kneser-Ney estimation of the word n-gram LM: modified Kneser-Ney estimates checked by hand and through KenLM, on
real transcripts; the tool that writes the ARPA file."""
import logging
import subprocess
import sys

import kenlm
import pytest

from toolkit.text.common_words import common_words
from toolkit.text.kneser_ney import FALLBACK_DISCOUNTS, kneser_ney_arpa, modified_kn_discounts
from toolkit.text.ngram_lm import arpa_vocabulary

from test.helpers import REPO_ROOT



def prob(model, context, word):
    """P(word | <s> context) through KenLM."""
    state, out = kenlm.State(), kenlm.State()
    model.BeginSentenceWrite(state)
    for w in context:
        model.BaseScore(state, w, out)
        state, out = out, kenlm.State()
    return 10 ** model.BaseScore(state, word, out)


def test_discounts_follow_chen_and_goodman_from_counts_of_counts():
    counts = [1] * 10 + [2] * 4 + [3] * 2 + [4] + [7] * 5
    y = 10 / (10 + 2 * 4)
    expected = (1 - 2 * y * 4 / 10, 2 - 3 * y * 2 / 4, 3 - 4 * y * 1 / 2)
    assert modified_kn_discounts(counts) == pytest.approx(expected)


def test_the_fallback_discounts_warn_of_sparse_text_and_not_of_saturated_counts(caplog):
    with caplog.at_level(logging.INFO):
        assert modified_kn_discounts([1, 1, 2], order=3) == FALLBACK_DISCOUNTS  # nothing seen 3 or 4 times
        assert modified_kn_discounts([5, 9, 40], order=1) == FALLBACK_DISCOUNTS  # letters: all seen more than 4 times
    levels = [(record.levelno, record.getMessage().split(":")[0]) for record in caplog.records]
    assert levels == [(logging.WARNING, "modified Kneser-Ney, 3-grams"), (logging.INFO, "modified Kneser-Ney, 1-grams")]


def test_a_bigram_model_computed_by_hand(estimated_lm):
    # <s> A B </s> twice, <s> A C </s> once; every order too small for its own discounts: 0.5, 1, 1.5.
    # Unigrams (continuation counts): A 1, B 1, C 1, </s> 2, <unk> 0 of 5; gamma = (0.5 * 3 + 1 * 1) / 5 = 0.5,
    # so p(A) = (1 - 0.5) / 5 + 0.5 / 5 = 0.2, p(</s>) = (2 - 1) / 5 + 0.1 = 0.3, p(<unk>) = 0.1.
    # Bigrams (raw counts): after <s>, A 3 of 3: p(A|<s>) = (3 - 1.5) / 3 + 0.5 * 0.2 = 0.6; after A, B 2, C 1:
    # gamma(A) = (1 + 0.5) / 3, p(B|A) = 1 / 3 + 0.5 * 0.2, p(C|A) = 0.5 / 3 + 0.1; unseen: p(C|<s>) = 0.5 * 0.2.
    model, _ = estimated_lm([["A", "B"], ["A", "B"], ["A", "C"]], order=2)
    expected = {((), "A"): 0.6, (("A",), "B"): 1 / 3 + 0.1, (("A",), "C"): 0.5 / 3 + 0.1,
                (("A", "B"), "</s>"): 0.5 + 0.5 * 0.3, ((), "C"): 0.1, (("A",), "ZZZ"): 0.5 * 0.1}
    for (context, word), p in expected.items():
        assert prob(model, context, word) == pytest.approx(p, rel=1e-5), (context, word)


def test_a_prior_puts_its_words_in_the_vocabulary_with_the_mass_kneser_ney_keeps_back(estimated_lm):
    # The model of the test above with the prior {A: 1, ZED: 3}: the words of the text missing from it (B, C, </s>,
    # <unk>) weigh its smallest weight, 1, so the base is 1/8 for each but ZED, 3/8. The unigrams keep their
    # discounted counts and gamma = 0.5: p(A) = 0.1 + 0.5 / 8, p(</s>) = 0.2 + 0.5 / 8, p(ZED) = 0.5 * 3 / 8.
    model, path = estimated_lm([["A", "B"], ["A", "B"], ["A", "C"]], order=2, prior={"A": 1, "ZED": 3})
    assert arpa_vocabulary(str(path)) == {"<s>", "</s>", "<unk>", "A", "B", "C", "ZED"}
    p_a, p_end, p_zed = 0.1 + 0.5 / 8, 0.2 + 0.5 / 8, 0.5 * 3 / 8
    expected = {((), "A"): 1.5 / 3 + 0.5 * p_a, (("A",), "B"): 1 / 3 + 0.5 * p_a, (("A",), "ZED"): 0.5 * p_zed,
                (("A", "B"), "</s>"): 0.5 + 0.5 * p_end, (("A",), "NOTAWORD"): 0.5 * 0.5 / 8}
    for (context, word), p in expected.items():
        assert prob(model, context, word) == pytest.approx(p, rel=1e-5), (context, word)
    for prior in ({"A": 0}, {"A": float("nan")}, {"A": True}, {"<s>": 1.0}, {}):
        with pytest.raises(ValueError, match="the unigram prior needs finite weights > 0"):
            kneser_ney_arpa([["A"]], 2, prior)


def test_common_words_are_the_most_frequent_english_words_the_alphabet_spells():
    letters = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ'")
    words = common_words(2000, letters, upper=True)
    assert len(words) == 2000 and list(words)[:4] == ["THE", "TO", "AND", "OF"]
    assert {"DON'T", "SEVEN", "WATER"} <= set(words) and all(set(w) <= letters for w in words)
    frequencies = list(words.values())
    assert frequencies == sorted(frequencies, reverse=True) and 0 < frequencies[-1] < frequencies[0] < 0.1
    assert list(common_words(3, set("theoa"), upper=False)) == ["the", "to", "a"]
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        common_words(0, letters, upper=True)


@pytest.mark.parametrize("order, prior_words", [(2, 0), (3, 0), (4, 0), (3, 5000)])
def test_every_distribution_sums_to_one_on_real_transcripts(order, prior_words, estimated_lm):
    text = REPO_ROOT / "corpora/kathleen/data/train/text"
    sentences = [line.split()[1:] for line in text.read_text(encoding="utf-8").splitlines()]
    prior = common_words(prior_words, set("ABCDEFGHIJKLMNOPQRSTUVWXYZ'"), upper=True) if prior_words else None
    model, path = estimated_lm(sentences, order, prior=prior)
    vocab = sorted(arpa_vocabulary(str(path)) - {"<s>"})
    assert len(vocab) > 1000 + prior_words // 2 and "<unk>" in vocab and "</s>" in vocab
    frequent = [s[:order - 1] for s in sentences if len(s) >= order - 1][:5]
    for context in [[], ["THE"], ["OF", "THE"][: order - 1], ["NOTAWORD"], *frequent]:
        assert sum(prob(model, context, w) for w in vocab) == pytest.approx(1.0, abs=1e-5), context


def test_the_tool_writes_the_arpa_and_refuses_an_empty_text(tmp_path):
    tool = [sys.executable, str(REPO_ROOT / "tools/train_ngram_lm.py"), "--order", "3"]
    out = tmp_path / "lm" / "lm.arpa"
    run = subprocess.run(tool + [str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"), str(out)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "ngram 1 " in run.stdout and kenlm.Model(str(out)).order == 3
    digits = arpa_vocabulary(str(out)) - {"<s>", "</s>", "<unk>"}
    assert digits == {"ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"}
    # with the 300 most frequent English words its letters spell (upper case, as the transcripts)
    run = subprocess.run(tool + ["--common_words", "300", str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "common words 300, ngram 1 " in run.stdout, run.stderr
    vocabulary = arpa_vocabulary(str(out))
    assert digits < vocabulary and {"THE", "ONE", "HIS"} <= vocabulary and "AND" not in vocabulary  # no D
    assert len(vocabulary - digits) == 300 - len(digits & set(common_words(300, set("EFGHINORSTUVWXZ"), True))) + 3
    empty = tmp_path / "text"
    empty.write_text("utt1\n")
    run = subprocess.run(tool + [str(empty), str(tmp_path / "x.arpa")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [f"{empty}: no words to estimate an n-gram "
                                                                      "model from"]
    assert not (tmp_path / "x.arpa").exists()
    # the spelling LM: the distinct words of the text, letter by letter
    run = subprocess.run(tool + ["--spelling", str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "sentences 10, words 40, ngram 1 " in run.stdout, run.stderr
    assert arpa_vocabulary(str(out)) == set("EFGHINORSTUVWXZ") | {"<s>", "</s>", "<unk>"}
    spelling = kenlm.Model(str(out))
    after_zer = {c: prob(spelling, "ZER", c) for c in "EFGHINORSTUVWXZ"}  # "ZER" only ever goes on to "O"
    assert max(after_zer, key=after_zer.get) == "O" and after_zer["O"] > 0.5
    run = subprocess.run(tool + [str(tmp_path / "missing"), str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1 and "No such file" in run.stderr


def test_the_estimator_refuses_orders_kenlm_cannot_load_and_sentence_markers_in_the_text():
    for order in (1, 7):
        with pytest.raises(ValueError, match=f"must be in 2..6 .what KenLM loads., got {order}"):
            kneser_ney_arpa([["A"]], order)
    with pytest.raises(ValueError, match="sentence 2 holds <s> or </s>"):
        kneser_ney_arpa([["A"], ["A", "<s>", "B"]], 2)
