"""The word n-gram LM: modified Kneser-Ney estimates checked by hand and through KenLM, on real transcripts."""
import gzip
import logging
import math
import subprocess
import sys

import kenlm
import pytest

from toolkit.text.common_words import common_words
from toolkit.text.ngram_lm import (FALLBACK_DISCOUNTS, WordNgramLM, arpa_vocabulary, kneser_ney_arpa,
                                   modified_kn_discounts)

from test.helpers import REPO_ROOT


def kenlm_model(tmp_path, sentences, order, name="lm.arpa", prior=None):
    path = tmp_path / name
    path.write_text(kneser_ney_arpa(sentences, order, prior), encoding="utf-8")
    return kenlm.Model(str(path)), path


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


def test_a_bigram_model_computed_by_hand(tmp_path):
    # <s> A B </s> twice, <s> A C </s> once; every order too small for its own discounts: 0.5, 1, 1.5.
    # Unigrams (continuation counts): A 1, B 1, C 1, </s> 2, <unk> 0 of 5; gamma = (0.5 * 3 + 1 * 1) / 5 = 0.5,
    # so p(A) = (1 - 0.5) / 5 + 0.5 / 5 = 0.2, p(</s>) = (2 - 1) / 5 + 0.1 = 0.3, p(<unk>) = 0.1.
    # Bigrams (raw counts): after <s>, A 3 of 3: p(A|<s>) = (3 - 1.5) / 3 + 0.5 * 0.2 = 0.6; after A, B 2, C 1:
    # gamma(A) = (1 + 0.5) / 3, p(B|A) = 1 / 3 + 0.5 * 0.2, p(C|A) = 0.5 / 3 + 0.1; unseen: p(C|<s>) = 0.5 * 0.2.
    model, _ = kenlm_model(tmp_path, [["A", "B"], ["A", "B"], ["A", "C"]], order=2)
    expected = {((), "A"): 0.6, (("A",), "B"): 1 / 3 + 0.1, (("A",), "C"): 0.5 / 3 + 0.1,
                (("A", "B"), "</s>"): 0.5 + 0.5 * 0.3, ((), "C"): 0.1, (("A",), "ZZZ"): 0.5 * 0.1}
    for (context, word), p in expected.items():
        assert prob(model, context, word) == pytest.approx(p, rel=1e-5), (context, word)


def test_a_prior_puts_its_words_in_the_vocabulary_with_the_mass_kneser_ney_keeps_back(tmp_path):
    # The model of the test above with the prior {A: 1, ZED: 3}: the words of the text missing from it (B, C, </s>,
    # <unk>) weigh its smallest weight, 1, so the base is 1/8 for each but ZED, 3/8. The unigrams keep their
    # discounted counts and gamma = 0.5: p(A) = 0.1 + 0.5 / 8, p(</s>) = 0.2 + 0.5 / 8, p(ZED) = 0.5 * 3 / 8.
    model, path = kenlm_model(tmp_path, [["A", "B"], ["A", "B"], ["A", "C"]], order=2, prior={"A": 1, "ZED": 3})
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
def test_every_distribution_sums_to_one_on_real_transcripts(tmp_path, order, prior_words):
    text = REPO_ROOT / "corpora/kathleen/data/train/text"
    sentences = [line.split()[1:] for line in text.read_text(encoding="utf-8").splitlines()]
    prior = common_words(prior_words, set("ABCDEFGHIJKLMNOPQRSTUVWXYZ'"), upper=True) if prior_words else None
    model, path = kenlm_model(tmp_path, sentences, order, prior=prior)
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
    run = subprocess.run(tool + ["--common_words", "300", str(REPO_ROOT / "corpora/tiny_fsdd/data/train/text"),
                                 str(out)], capture_output=True, text=True, timeout=60)
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


def test_fusion_scores_whole_words_as_kenlm_scores_the_sentence(tmp_path):
    _, path = kenlm_model(tmp_path, [["SIX", "TWO"], ["SIX"], ["TWO", "SIX"]], order=2)
    model = kenlm.Model(str(path))
    # SentencePiece-style pieces: "▁SI" starts a word, "X" continues it; and char "▁" on its own.
    units = {0: "<blank>", 1: "<unk>", 2: "▁SI", 3: "X", 4: "▁", 5: "T", 6: "W", 7: "O"}
    lm = WordNgramLM(str(path), units, weight=0.7, word_bonus=2.0)
    for tokens, words in (([2, 3, 2, 3], "SIX SIX"), ([2, 3, 4, 5, 6, 7], "SIX TWO"), ([4, 5, 6], "TW")):
        part, prefix = lm.start(), []
        for token in tokens:
            part = lm.extend(part, prefix, token)
            prefix.append(token)
        expected = 0.7 * math.log(10) * model.score(words) + 2.0 * len(words.split())
        assert lm.finish(part, prefix) == pytest.approx(expected, rel=1e-6)  # KenLM sums in float32


def test_the_oov_penalty_applies_from_where_a_word_leaves_the_vocabulary_and_to_the_whole_word(tmp_path):
    _, path = kenlm_model(tmp_path, [["SIX"], ["SEVEN"]], order=2)
    model = kenlm.Model(str(path))
    units = {0: "<blank>", 1: "<unk>", 2: "▁", 3: "S", 4: "I", 5: "X", 6: "E", 7: "Q"}
    lm = WordNgramLM(str(path), units, weight=1.0, word_bonus=0.0, oov_penalty=-10.0)
    penalties, part, prefix = [], lm.start(), []
    for token in [3, 4, 5, 2, 3, 7, 2, 3]:  # S I X ▁ S Q ▁ S: "SQ" begins no word
        part = lm.extend(part, prefix, token)
        prefix.append(token)
        penalties.append(round(part.score - part.closed, 6))
    assert penalties == [0.0, 0.0, 0.0, 0.0, 0.0, -10.0, 0.0, 0.0]
    # Once complete, the OOV word keeps its penalty: nothing is gained by ending it early.
    expected = math.log(10) * model.score("SIX SQ S") - 10.0 * 2  # "S" is no word of the LM either
    assert lm.finish(part, prefix) == pytest.approx(expected, rel=1e-6)


def test_the_spelling_lm_scores_an_oov_word_by_its_letters_from_where_it_leaves_the_vocabulary(tmp_path):
    _, path = kenlm_model(tmp_path, [["SIX"], ["SEVEN"]], order=2)
    model = kenlm.Model(str(path))
    spelling, spelling_path = kenlm_model(tmp_path, [list("SIX"), list("SEVEN"), list("SIXES")], order=3,
                                          name="spelling.arpa")
    units = {0: "<blank>", 1: "<unk>", 2: "▁", 3: "S", 4: "I", 5: "X", 6: "E", 7: "Q"}
    lm = WordNgramLM(str(path), units, weight=0.5, word_bonus=1.0, oov_penalty=-2.0, spelling_path=str(spelling_path))
    ln = math.log(10)
    partial, part, prefix = [], lm.start(), []
    for token in [3, 4, 5, 2, 3, 7, 2, 3, 6]:  # S I X ▁ S Q ▁ S E: "SQ" begins no word, "SE" begins SEVEN
        part = lm.extend(part, prefix, token)
        prefix.append(token)
        partial.append(part.score - part.closed)
    # letters so far, without the word's end
    assert partial[:5] == [0.0] * 5 and partial[6:] == [0.0] * 3
    assert partial[5] == pytest.approx(-2.0 + 0.5 * ln * spelling.score("S Q", bos=True, eos=False), rel=1e-6)
    # In-vocabulary words score as without the spelling LM; each OOV word adds its whole spelling, </s> included.
    expected = (0.5 * ln * (model.score("SIX SQ SE") + spelling.score("S Q") + spelling.score("S E"))
                + 1.0 * 3 - 2.0 * 2)
    assert lm.finish(part, prefix) == pytest.approx(expected, rel=1e-6)
    # An English-like unseen word costs less than an unlikely one, where a flat penalty makes them equal.
    assert spelling.score("S I X E S") > spelling.score("Q X Q E I") + 3


def test_bad_lm_settings_and_an_lm_the_units_cannot_spell_are_refused(tmp_path):
    sentences = [["six", "two"], ["six"], ["two", "one"]]
    _, lower = kenlm_model(tmp_path, sentences, order=2)
    _, upper = kenlm_model(tmp_path, [[w.upper() for w in s] for s in sentences], order=2, name="upper.arpa")
    units = {0: "<blank>", 1: "<unk>", 2: "▁", **{3 + i: c for i, c in enumerate("ENOSTWIX")}, 11: "<sos/eos>"}
    with pytest.raises(ValueError, match=r"3 of the LM's 3 words cannot be spelt with the model's units \(e.g. 'one'\)"):
        WordNgramLM(str(lower), units, 0.5, 0.0)
    assert WordNgramLM(str(upper), units, 0.5, 0.0, -10.0).vocabulary == {"SIX", "TWO", "ONE"}
    for weight, bonus, penalty in ((-0.1, 0.0, 0.0), (float("nan"), 0.0, 0.0), (0.5, float("inf"), 0.0),
                                   (0.5, 0.0, 1.0)):
        with pytest.raises(ValueError, match="need lm_weight >= 0"):
            WordNgramLM(str(upper), units, weight, bonus, penalty)


def test_the_estimator_refuses_orders_kenlm_cannot_load_and_sentence_markers_in_the_text():
    for order in (1, 7):
        with pytest.raises(ValueError, match=f"must be in 2..6 .what KenLM loads., got {order}"):
            kneser_ney_arpa([["A"]], order)
    with pytest.raises(ValueError, match="sentence 2 holds <s> or </s>"):
        kneser_ney_arpa([["A"], ["A", "<s>", "B"]], 2)


def test_a_gzipped_arpa_file_is_read_like_the_plain_one(tmp_path):
    _, path = kenlm_model(tmp_path, [["SIX", "TWO"], ["SIX"]], order=2)
    packed = tmp_path / "lm.arpa.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert arpa_vocabulary(str(packed)) == arpa_vocabulary(str(path)) == {"<s>", "</s>", "<unk>", "SIX", "TWO"}
    binary = tmp_path / "not_arpa"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n")
    with pytest.raises(ValueError, match="not an ARPA file"):
        arpa_vocabulary(str(binary))
