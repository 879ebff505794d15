"""Word n-gram language model for decoding: estimated from training transcripts into an ARPA file, queried
through KenLM (Heafield, 2011) while CTC prefix beam search runs (shallow fusion).

Estimation is interpolated modified Kneser-Ney (Chen & Goodman, 1998, "An Empirical Study of Smoothing Techniques
for Language Modeling", TR-10-98, sections 3.5-3.6 and 4.1.6), written in the backoff form of the ARPA format
(every probability already interpolated, each backoff weight the context's interpolation weight), as KenLM's
``lmplz`` writes it. It lives here because ``lmplz`` is not installable from PyPI (the ``kenlm`` package builds
only the query module; ``lmplz`` needs Boost), and the pure-Python ``arpabo`` 0.3.0 writes every backoff weight as
1, an unnormalised model. Any ARPA or KenLM binary file, e.g. one built by ``lmplz`` on more text, can be decoded
with instead (:class:`WordNgramLM`).

Sentences are padded as ``<s> w1 .. wk </s>``; words are case-sensitive and whitespace-separated; ``<unk>`` gets
only the uniform share of the unigram distribution (an out-of-vocabulary word scores as ``<unk>``).
"""
from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from typing import Iterable, NamedTuple, Sequence

import kenlm

from toolkit.text.tokenizer import UNK, WORD_BOUNDARY
from toolkit.utils.checkpoint import atomic_write

BOS, EOS = "<s>", "</s>"
# Used, with a warning, where an order's counts of counts cannot give the modified Kneser-Ney discounts (too
# little text; lmplz's --discount_fallback takes the same values).
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
LN_10 = math.log(10.0)


def modified_kn_discounts(adjusted_counts: Iterable[int]) -> tuple[float, float, float]:
    """D1, D2, D3+ of one order from its n-grams' adjusted counts (Chen & Goodman, eq. 26).

    Returns :data:`FALLBACK_DISCOUNTS` (and logs a warning) when an order has no n-gram seen exactly 1, 2, 3 or 4
    times, or a discount falls outside (0, k).
    """
    n = Counter(count for count in adjusted_counts if count <= 4)
    if all(n[k] > 0 for k in (1, 2, 3, 4)):
        y = n[1] / (n[1] + 2 * n[2])
        discounts = tuple(k - (k + 1) * y * n[k + 1] / n[k] for k in (1, 2, 3))
        if all(0 < d < k for k, d in zip((1, 2, 3), discounts)):
            return discounts
    logging.warning("modified Kneser-Ney: counts of counts %s give no valid discounts (too little text for this "
                    "order); using %s", [n[k] for k in (1, 2, 3, 4)], FALLBACK_DISCOUNTS)
    return FALLBACK_DISCOUNTS


def kneser_ney_arpa(sentences: Iterable[Sequence[str]], order: int) -> str:
    """The text of an ARPA file of an interpolated modified Kneser-Ney word n-gram model.

    Args:
        sentences: each a list of words (no ``<s>``/``</s>``); empty ones are ignored.
        order: n-gram order, >= 1.

    Returns:
        ARPA text: log10 probabilities and backoff weights, 7 significant digits.

    Raises:
        ValueError: ``order`` < 1, or no word at all.
    """
    if order < 1:
        raise ValueError(f"n-gram order must be >= 1, got {order}")
    raw: list[Counter] = [Counter() for _ in range(order + 1)]  # raw[n][ngram tuple]
    for words in sentences:
        if not words:
            continue
        padded = (BOS, *words, EOS)
        for n in range(1, order + 1):
            for i in range(len(padded) - n + 1):
                raw[n][padded[i:i + n]] += 1
    if not raw[1]:
        raise ValueError("no words to estimate an n-gram model from")
    # Adjusted counts: raw counts at the highest order and for n-grams starting with <s> (nothing precedes them);
    # elsewhere the number of distinct words seen before the n-gram (the continuation count).
    adjusted: list[dict] = [{} for _ in range(order + 1)]
    adjusted[order] = dict(raw[order])
    for n in range(order - 1, 0, -1):
        left = Counter(ngram[1:] for ngram in raw[n + 1])
        adjusted[n] = {ngram: count if ngram[0] == BOS else left[ngram] for ngram, count in raw[n].items()}
    adjusted[1].pop((BOS,), None)  # <s> is never predicted
    adjusted[1].setdefault((UNK,), 0)
    probs: list[dict] = [{} for _ in range(order + 1)]
    backoffs: list[dict] = [{} for _ in range(order + 1)]  # backoffs[n][context of n words]
    vocab_size = len(adjusted[1])
    for n in range(1, order + 1):
        discounts = (0.0, *modified_kn_discounts(adjusted[n].values()))
        totals: dict = defaultdict(int)
        mass: dict = defaultdict(float)
        for ngram, count in adjusted[n].items():
            totals[ngram[:-1]] += count
            mass[ngram[:-1]] += discounts[min(count, 3)]
        for context, total in totals.items():
            backoffs[n - 1][context] = mass[context] / total
        for ngram, count in adjusted[n].items():
            context = ngram[:-1]
            lower = probs[n - 1][ngram[1:]] if n > 1 else 1.0 / vocab_size
            probs[n][ngram] = (count - discounts[min(count, 3)]) / totals[context] + backoffs[n - 1][context] * lower
    lines = ["\\data\\"] + [f"ngram {n}={len(probs[n]) + (n == 1)}" for n in range(1, order + 1)]
    for n in range(1, order + 1):
        lines += ["", f"\\{n}-grams:"]
        entries = sorted(probs[n].items())
        if n == 1:
            entries.append(((BOS,), 0.0))
        for ngram, p in entries:
            log_p = -99.0 if ngram == (BOS,) else math.log10(p)
            line = f"{log_p:.7g}\t{' '.join(ngram)}"
            if n < order and ngram in backoffs[n]:
                line += f"\t{math.log10(backoffs[n][ngram]):.7g}"
            lines.append(line)
    lines += ["", "\\end\\", ""]
    return "\n".join(lines)


def write_kneser_ney_arpa(text_file: str, arpa_path: str, order: int) -> dict[str, int]:
    """Estimate the model (:func:`kneser_ney_arpa`) from the transcripts of a Kaldi ``text`` file
    (``key word word ...`` per line; the key is dropped) and write it atomically to ``arpa_path``.

    Returns:
        ``{"sentences": .., "words": .., "ngram 1": .., ...}``.

    Raises:
        ValueError: as :func:`kneser_ney_arpa` (an empty text file).
    """
    with open(text_file, encoding="utf-8") as f:
        sentences = [line.split()[1:] for line in f]
    arpa = kneser_ney_arpa(sentences, order)
    atomic_write(arpa_path, lambda out: out.write(arpa.encode("utf-8")))
    sizes = {line.split("=")[0]: int(line.split("=")[1]) for line in arpa.splitlines() if line.startswith("ngram ")}
    return {"sentences": sum(1 for s in sentences if s), "words": sum(len(s) for s in sentences), **sizes}


class LMPart(NamedTuple):
    """The LM's part of one prefix in CTC prefix beam search: ``score`` (what the prefix competes on: its complete
    words' fused score, plus the open-word penalty while its open word begins no word of the LM), the fused score
    of the complete words alone, the KenLM state after them, and where in the prefix the open word starts."""
    score: float
    closed: float
    state: kenlm.State
    word_start: int


def arpa_vocabulary(path: str) -> set[str]:
    """The words of an ARPA file's ``\\1-grams:`` section (``<s>`` included).

    Raises:
        ValueError: no ``\\1-grams:`` section (not an ARPA file: a KenLM binary, say).
    """
    words: set[str] = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip() == "\\1-grams:":
                break
        else:
            raise ValueError(f"{path}: no \\1-grams: section; the open-word penalty needs an ARPA file")
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
    (:func:`toolkit.models.transformer.search.ctc_prefix_beam_search`, which calls :meth:`start`,
    :meth:`extend` and :meth:`finish`).

    A hypothesis' LM score is ``weight * ln P(w1 .. wk </s>) + word_bonus * k`` (natural log). A word is the units
    from one token starting with ``▁`` (char ``▁`` or SentencePiece ``▁X``) up to the next; it is scored once it is
    complete, when the next word starts or the hypothesis ends. Units are joined without ``▁``: a word holding
    ``<unk>`` or missing from the LM's vocabulary scores as ``<unk>``. While a prefix' open word is no beginning of
    any word of the LM's vocabulary, the prefix competes with ``open_word_penalty`` added, so that misspellings
    leave the beam before they end (the beam keeps the spellings the LM can score; as pyctcdecode's partial-word
    score does).

    Args:
        path: ARPA file, or a KenLM binary when ``open_word_penalty`` is 0.
        id_to_symbol: the tokenizer's ``{id: unit}``.
        weight: LM weight (0: words are only counted, with ``word_bonus``).
        word_bonus: added per word (> 0 offsets the LM's cost of each word, against deletions).
        open_word_penalty: added (<= 0) to a prefix whose open word begins no LM word; 0: off.

    Raises:
        OSError: KenLM cannot read ``path``.
        ValueError: ``open_word_penalty`` is not 0 and ``path`` has no unigram section.
    """

    def __init__(self, path: str, id_to_symbol: dict[int, str], weight: float, word_bonus: float,
                 open_word_penalty: float = 0.0):
        self.path = path
        self.model = kenlm.Model(path)
        self.weight, self.word_bonus, self.open_word_penalty = weight, word_bonus, open_word_penalty
        self.units = id_to_symbol
        self.starts_word = frozenset(i for i, unit in id_to_symbol.items() if unit.startswith(WORD_BOUNDARY))
        self.word_beginnings: set[str] = set()
        if open_word_penalty:
            for word in arpa_vocabulary(path):
                self.word_beginnings.update(word[:n] for n in range(1, len(word) + 1))

    def _log_p(self, state: kenlm.State, word: str) -> tuple[float, kenlm.State]:
        out = kenlm.State()
        return LN_10 * self.model.BaseScore(state, word, out), out

    def _word(self, prefix: Sequence[int], start: int) -> str:
        return "".join(self.units[i] for i in prefix[start:]).replace(WORD_BOUNDARY, "")

    def _close_word(self, part: LMPart, prefix: Sequence[int]) -> tuple[float, kenlm.State]:
        """Fused score and state after the open word of ``part``; no change when it spells no character."""
        word = self._word(prefix, part.word_start)
        if not word:
            return part.closed, part.state
        log_p, state = self._log_p(part.state, word)
        return part.closed + self.weight * log_p + self.word_bonus, state

    def start(self) -> LMPart:
        """The part of the empty prefix (state after ``<s>``)."""
        state = kenlm.State()
        self.model.BeginSentenceWrite(state)
        return LMPart(0.0, 0.0, state, 0)

    def extend(self, part: LMPart, prefix: Sequence[int], token: int) -> LMPart:
        """The part of ``prefix + [token]``, given ``part`` of ``prefix``: a token starting a word closes the
        open one."""
        if token in self.starts_word:
            closed, state = self._close_word(part, prefix)
            part = LMPart(closed, closed, state, len(prefix))
        if not self.open_word_penalty:
            return part
        word = self._word((*prefix, token), part.word_start)
        penalty = self.open_word_penalty if word and word not in self.word_beginnings else 0.0
        return part._replace(score=part.closed + penalty)

    def finish(self, part: LMPart, prefix: Sequence[int]) -> float:
        """The LM score of ``prefix`` as a whole hypothesis: its words, its open word and ``</s>``."""
        closed, state = self._close_word(part, prefix)
        return closed + self.weight * self._log_p(state, EOS)[0]
