"""Word n-gram language model for decoding: an ARPA file (or a KenLM binary) queried through KenLM (Heafield, 2011)
while CTC prefix beam search runs (shallow fusion). The recipe's ARPA files are estimated from training transcripts
by :mod:`toolkit.text.kneser_ney`; any other ARPA or KenLM binary file, e.g. one built by KenLM's ``lmplz`` on more
text, can be decoded with instead (:class:`WordNgramLM`).
"""
from __future__ import annotations

import gzip
import math
from typing import Iterable, NamedTuple, Sequence

import kenlm

from toolkit.text.tokenizer import SPECIAL_SYMBOLS, UNK, WORD_BOUNDARY
from toolkit.utils.unicode_text import NORMAL_FORM, is_normalized, normalize_unicode

BOS, EOS = "<s>", "</s>"
# KenLM loads orders 2..KENLM_MAX_ORDER; PyPI's kenlm is built with 6.
MIN_ORDER, MAX_ORDER = 2, 6
LN_10 = math.log(10.0)


class LMPart(NamedTuple):
    """The LM's part of one prefix in CTC prefix beam search: ``score`` (what the prefix competes on: ``closed``,
    plus the OOV penalty and the weighted spelling score of its letters while its open word begins no word of the
    LM), the fused score of its complete words
    (``closed``), the KenLM state after them, where in the prefix the open word starts, and, with a spelling LM,
    the natural-log probability of the open word's letters so far and the spelling LM's state after them."""
    score: float
    closed: float
    state: kenlm.State
    word_start: int
    spelt: float = 0.0
    spelling_state: kenlm.State | None = None


def arpa_vocabulary(path: str) -> set[str]:
    """The words of an ARPA file's ``\\1-grams:`` section (``<s>`` included); gzip-compressed files are read too.

    Raises:
        ValueError: no ``\\1-grams:`` section (not an ARPA file: a KenLM binary, say).
    """
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    words: set[str] = set()
    with (gzip.open if compressed else open)(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip() == "\\1-grams:":
                break
        else:
            raise ValueError("no \\1-grams: section: not an ARPA file (the OOV penalty and the spelling LM need one)")
        for line in f:
            fields = line.split()
            if not fields:
                continue
            if fields[0].startswith("\\"):
                break
            words.add(fields[1])
    return words


class WordNgramLM:
    """A word n-gram LM scoring the words of token-id prefixes, for shallow fusion in CTC prefix beam search
    (:class:`toolkit.models.transformer.search.CtcPrefixBeamSearch`, which calls :meth:`start`,
    :meth:`extend`, :meth:`bound` and :meth:`finish`).

    A hypothesis' LM score is ``weight * ln P(w1 .. wk </s>) + word_bonus * k + oov_penalty * (OOV words)``
    (natural log). A word is the units from one token starting with ``▁`` (char ``▁`` or SentencePiece ``▁X``) up to
    the next; it is scored once it is complete, when the next word starts or the hypothesis ends. Units are joined
    without ``▁`` (and NFC-normalised, :mod:`toolkit.utils.unicode_text`: an ARPA file whose words are not NFC is
    refused, ``ValueError``); a word missing from the LM's vocabulary (one holding ``<unk>`` too) scores as ``<unk>``, plus
    ``oov_penalty``. A prefix whose open word already begins no word of the LM competes with the penalty added from
    then on, so that misspellings leave the beam before they end (as pyctcdecode's partial-word score does), and
    ending such a word early gains nothing.

    With a spelling LM (a letter n-gram of words, :func:`toolkit.text.kneser_ney.write_kneser_ney_arpa` with
    ``spelling``), an OOV word w
    scores ``ln P(<unk> | history) + ln P_spelling(letters of w, </s>)`` under the weight, so that an English-like
    spelling costs less than an unlikely one instead of every OOV word costing the same (docs/recipe_ablation.md: the
    recipe's dev CER with and without); a prefix whose open word begins no word of the LM competes with ``weight``
    times its letters' log-probability so far (plus ``oov_penalty``).

    Args:
        path: ARPA file (gzip-compressed too), or a KenLM binary when ``oov_penalty`` is 0 and no spelling LM.
        id_to_symbol: the tokenizer's ``{id: unit}``.
        weight: LM weight, >= 0 (0: words are only counted, with ``word_bonus``).
        word_bonus: added per word (> 0 offsets the LM's cost of each word, against deletions).
        oov_penalty: added (<= 0) per out-of-vocabulary word; 0: off.
        spelling_path: the spelling LM (ARPA, or a KenLM binary): letters as its words; empty: none.

    Raises:
        OSError: KenLM cannot read ``path`` or ``spelling_path``.
        ValueError: a weight out of range or not finite; ``oov_penalty`` is not 0 or ``spelling_path`` is given,
            and ``path`` is not an ARPA file (its vocabulary is needed); most of the LM's words cannot be spelt with
            the units (an LM of text in another case or script); an ARPA word is not in Unicode NFC.
    """

    def __init__(self, path: str, id_to_symbol: dict[int, str], weight: float, word_bonus: float,
                 oov_penalty: float = 0.0, spelling_path: str = ""):
        if not (math.isfinite(weight) and weight >= 0 and math.isfinite(word_bonus) and math.isfinite(oov_penalty)
                and oov_penalty <= 0):
            raise ValueError(f"need lm_weight >= 0, a finite word_bonus and oov_penalty <= 0; got {weight}, "
                             f"{word_bonus}, {oov_penalty}")
        config = kenlm.Config()
        config.show_progress = False
        self.model = kenlm.Model(path, config)
        self.spelling = kenlm.Model(spelling_path, config) if spelling_path else None
        self.weight, self.word_bonus, self.oov_penalty = weight, word_bonus, oov_penalty
        self.units = id_to_symbol
        self.starts_word = frozenset(i for i, unit in id_to_symbol.items() if unit.startswith(WORD_BOUNDARY))
        try:
            self.vocabulary = arpa_vocabulary(path) - {BOS, EOS, UNK}
        except ValueError:
            if oov_penalty or spelling_path:
                raise
            self.vocabulary = set()  # a KenLM binary: its words are not checked
        not_normal = sorted(w for w in self.vocabulary if not is_normalized(w))
        if not_normal:
            raise ValueError(f"{len(not_normal)} of the LM's words are not in Unicode {NORMAL_FORM} (e.g. "
                             f"{not_normal[0]!r}), the form of the hypotheses, so they would never match: build the LM "
                             f"with tools/train_ngram_lm.py, or normalise its text to {NORMAL_FORM}")
        letters = {c for unit in id_to_symbol.values() if unit not in SPECIAL_SYMBOLS for c in unit} - {WORD_BOUNDARY}
        unspellable = sorted(w for w in self.vocabulary if not set(w) <= letters)
        if len(unspellable) > len(self.vocabulary) / 2:
            raise ValueError(f"{len(unspellable)} of the LM's {len(self.vocabulary)} words cannot be spelt with the "
                             f"model's units (e.g. {unspellable[0]!r}): an LM of text in another case or script?")
        self.checks_words = bool(oov_penalty or spelling_path)
        self.word_beginnings = ({w[:n] for w in self.vocabulary for n in range(1, len(w) + 1)} if self.checks_words
                                else set())

    def _log_p(self, state: kenlm.State, word: str) -> tuple[float, kenlm.State]:
        out = kenlm.State()
        return LN_10 * self.model.BaseScore(state, word, out), out

    def _word(self, tokens: Iterable[int]) -> str:
        return normalize_unicode("".join(self.units[i] for i in tokens).replace(WORD_BOUNDARY, ""))

    def _close_word(self, part: LMPart, prefix: Sequence[int]) -> tuple[float, kenlm.State]:
        """Fused score and state after the open word of ``part``; no change when it spells no character."""
        word = self._word(prefix[part.word_start:])
        if not word:
            return part.closed, part.state
        log_p, state = self._log_p(part.state, word)
        penalty = 0.0
        if self.checks_words and word not in self.vocabulary:
            penalty = self.oov_penalty
            if self.spelling is not None:
                log_p += part.spelt + LN_10 * self.spelling.BaseScore(part.spelling_state, EOS, kenlm.State())
        return part.closed + self.weight * log_p + self.word_bonus + penalty, state

    def _spelling_start(self) -> kenlm.State | None:
        if self.spelling is None:
            return None
        state = kenlm.State()
        self.spelling.BeginSentenceWrite(state)
        return state

    def start(self) -> LMPart:
        """The part of the empty prefix (state after ``<s>``)."""
        state = kenlm.State()
        self.model.BeginSentenceWrite(state)
        return LMPart(0.0, 0.0, state, 0, 0.0, self._spelling_start())

    def extend(self, part: LMPart, prefix: Sequence[int], token: int) -> LMPart:
        """The part of ``prefix + [token]``, given ``part`` of ``prefix``: a token starting a word closes the
        open one."""
        if token in self.starts_word:
            closed, state = self._close_word(part, prefix)
            part = LMPart(closed, closed, state, len(prefix), 0.0, self._spelling_start())
        if self.spelling is not None:
            spelt, state = part.spelt, part.spelling_state
            for letter in self.units[token].replace(WORD_BOUNDARY, ""):
                out = kenlm.State()
                spelt += LN_10 * self.spelling.BaseScore(state, letter, out)
                state = out
            part = part._replace(spelt=spelt, spelling_state=state)
        if not self.checks_words:
            return part
        word = self._word((*prefix[part.word_start:], token))
        if word and word not in self.word_beginnings:
            return part._replace(score=part.closed + self.oov_penalty + self.weight * part.spelt)
        return part._replace(score=part.closed)

    def bound(self, part: LMPart) -> float:
        """An upper bound on the score of every one-token extension of ``part``'s prefix: its complete words' score,
        plus the word bonus if positive (a token that closes the open word adds ``weight`` x a log-probability,
        the bonus and an OOV penalty <= 0; one that continues it adds a penalty and a spelling score <= 0 or
        nothing)."""
        return part.closed + max(0.0, self.word_bonus)

    def finish(self, part: LMPart, prefix: Sequence[int]) -> float:
        """The LM score of ``prefix`` as a whole hypothesis: its words, its open word and ``</s>``."""
        closed, state = self._close_word(part, prefix)
        return closed + self.weight * self._log_p(state, EOS)[0]
