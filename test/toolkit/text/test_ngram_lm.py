"""The word n-gram LM in decoding: fusion scores whole words as KenLM scores the sentence, the OOV penalty and the
spelling LM, the settings refused, ARPA files read."""
import gzip
import math

import kenlm
import pytest

from toolkit.text.ngram_lm import WordNgramLM, arpa_vocabulary


def test_fusion_scores_whole_words_as_kenlm_scores_the_sentence(estimated_lm):
    _, path = estimated_lm([["SIX", "TWO"], ["SIX"], ["TWO", "SIX"]], order=2)
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


def test_the_oov_penalty_applies_from_where_a_word_leaves_the_vocabulary_and_to_the_whole_word(estimated_lm):
    _, path = estimated_lm([["SIX"], ["SEVEN"]], order=2)
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


def test_the_spelling_lm_scores_an_oov_word_by_its_letters_from_where_it_leaves_the_vocabulary(estimated_lm):
    _, path = estimated_lm([["SIX"], ["SEVEN"]], order=2)
    model = kenlm.Model(str(path))
    spelling, spelling_path = estimated_lm([list("SIX"), list("SEVEN"), list("SIXES")], order=3,
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


def test_bad_lm_settings_and_an_lm_the_units_cannot_spell_are_refused(estimated_lm):
    sentences = [["six", "two"], ["six"], ["two", "one"]]
    _, lower = estimated_lm(sentences, order=2)
    _, upper = estimated_lm([[w.upper() for w in s] for s in sentences], order=2, name="upper.arpa")
    units = {0: "<blank>", 1: "<unk>", 2: "▁", **{3 + i: c for i, c in enumerate("ENOSTWIX")}, 11: "<sos/eos>"}
    with pytest.raises(ValueError, match=r"3 of the LM's 3 words cannot be spelt with the model's units \(e.g. 'one'\)"):
        WordNgramLM(str(lower), units, 0.5, 0.0)
    assert WordNgramLM(str(upper), units, 0.5, 0.0, -10.0).vocabulary == {"SIX", "TWO", "ONE"}
    for weight, bonus, penalty in ((-0.1, 0.0, 0.0), (float("nan"), 0.0, 0.0), (0.5, float("inf"), 0.0),
                                   (0.5, 0.0, 1.0)):
        with pytest.raises(ValueError, match="need lm_weight >= 0"):
            WordNgramLM(str(upper), units, weight, bonus, penalty)


def test_a_gzipped_arpa_file_is_read_like_the_plain_one(tmp_path, estimated_lm):
    _, path = estimated_lm([["SIX", "TWO"], ["SIX"]], order=2)
    packed = tmp_path / "lm.arpa.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert arpa_vocabulary(str(packed)) == arpa_vocabulary(str(path)) == {"<s>", "</s>", "<unk>", "SIX", "TWO"}
    binary = tmp_path / "not_arpa"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n")
    with pytest.raises(ValueError, match="not an ARPA file"):
        arpa_vocabulary(str(binary))
