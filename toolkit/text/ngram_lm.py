"""Word n-gram language model for decoding: estimated from training transcripts into an ARPA file, queried
through KenLM (Heafield, 2011) while CTC prefix beam search runs (shallow fusion).

Estimation is interpolated modified Kneser-Ney (Chen & Goodman, 1998, "An Empirical Study of Smoothing Techniques
for Language Modeling", TR-10-98, sections 3.5-3.6 and 4.1.6), written in the backoff form of the ARPA format
(every probability already interpolated, each backoff weight the context's interpolation weight), as KenLM's
``lmplz`` writes it. It lives here because ``lmplz`` is not installable from PyPI (the ``kenlm`` package builds
only the query module; ``lmplz`` needs Boost), and the pure-Python ``arpabo`` 0.3.0 writes every backoff weight as
1, an unnormalised model. Any ARPA or KenLM binary file, e.g. one built by ``lmplz`` on more text, can be decoded
with instead (:class:`WordNgramLM`).

The same estimate over words spelt letter by letter gives the spelling LM that scores the words the word LM lacks.

Sentences are padded as ``<s> w1 .. wk </s>``; words are case-sensitive and whitespace-separated. The unigram
level interpolates with a base distribution: uniform over the vocabulary (``<unk>`` gets only its share of it; an
out-of-vocabulary word scores as ``<unk>``), or a prior over a larger word list, such as a language's most frequent
words (:func:`toolkit.text.common_words.common_words`), which puts those words in the LM's vocabulary with their
share of the mass that Kneser-Ney keeps back for words not seen in the text (the same recursion: every distribution
still sums to one).
"""
from __future__ import annotations

import gzip
import logging
import math
from collections import Counter, defaultdict
from typing import Iterable, Mapping, NamedTuple, Sequence

import kenlm

from toolkit.text.tokenizer import SPECIAL_SYMBOLS, UNK, WORD_BOUNDARY
from toolkit.utils.checkpoint import atomic_write

BOS, EOS = "<s>", "</s>"
# KenLM loads orders 2..KENLM_MAX_ORDER; PyPI's kenlm is built with 6.
MIN_ORDER, MAX_ORDER = 2, 6
# Used, with a warning, where an order's counts of counts cannot give the modified Kneser-Ney discounts (too
# little text; lmplz's --discount_fallback takes the same values).
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
LN_10 = math.log(10.0)


def modified_kn_discounts(adjusted_counts: Iterable[int], order: int = 0) -> tuple[float, float, float]:
    """D1, D2, D3+ of one order from its n-grams' adjusted counts (Chen & Goodman, eq. 26).

    Returns :data:`FALLBACK_DISCOUNTS` when an order has no n-gram seen exactly 1, 2, 3 or 4 times, or a discount
    falls outside (0, k): logged as a warning naming ``order`` (too little text), or as information when every
    n-gram of the order was seen more than 4 times (a spelling model's letters: nothing is sparse, and the discounts
    barely matter).
    """
    n = Counter(count for count in adjusted_counts if count <= 4)
    if all(n[k] > 0 for k in (1, 2, 3, 4)):
        y = n[1] / (n[1] + 2 * n[2])
        discounts = tuple(k - (k + 1) * y * n[k + 1] / n[k] for k in (1, 2, 3))
        if all(0 < d < k for k, d in zip((1, 2, 3), discounts)):
            return discounts
    if not n:
        logging.info("modified Kneser-Ney, %d-grams: every one seen more than 4 times (as letters are), so the counts "
                     "of counts give no discounts; using %s", order, FALLBACK_DISCOUNTS)
    else:
        logging.warning("modified Kneser-Ney, %d-grams: counts of counts %s give no valid discounts (too little "
                        "text); using %s", order, [n[k] for k in (1, 2, 3, 4)], FALLBACK_DISCOUNTS)
    return FALLBACK_DISCOUNTS


def kneser_ney_arpa(sentences: Iterable[Sequence[str]], order: int, prior: Mapping[str, float] | None = None) -> str:
    """The text of an ARPA file of an interpolated modified Kneser-Ney word n-gram model.

    Args:
        sentences: each a list of words; empty ones are ignored.
        order: n-gram order, in [MIN_ORDER, MAX_ORDER] (what KenLM loads).
        prior: ``{word: weight > 0}``, the base distribution the unigrams interpolate with, in place of the
            uniform one: its words join the vocabulary, and every word gets the base probability
            ``weight / sum`` (a word of the text or ``<unk>`` missing from it: the smallest weight). None: uniform.

    Returns:
        ARPA text: log10 probabilities and backoff weights, 7 significant digits.

    Raises:
        ValueError: ``order`` out of range; a sentence holding ``<s>`` or ``</s>`` (named by its 1-based
            index); no word at all; a prior weight that is not a finite number > 0, or a prior word ``<s>``.
    """
    if not MIN_ORDER <= order <= MAX_ORDER:
        raise ValueError(f"n-gram order must be in {MIN_ORDER}..{MAX_ORDER} (what KenLM loads), got {order}")
    raw: list[Counter] = [Counter() for _ in range(order + 1)]  # raw[n][ngram tuple]
    for index, words in enumerate(sentences, 1):
        if not words:
            continue
        if BOS in words or EOS in words:
            raise ValueError(f"sentence {index} holds {BOS} or {EOS}, which mark sentence ends in the model")
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
    base = _base_distribution(adjusted[1], prior)
    probs: list[dict] = [{} for _ in range(order + 1)]
    backoffs: list[dict] = [{} for _ in range(order + 1)]  # backoffs[n][context of n words]
    for n in range(1, order + 1):
        discounts = (0.0, *modified_kn_discounts(adjusted[n].values(), n))
        totals: dict = defaultdict(int)
        mass: dict = defaultdict(float)
        for ngram, count in adjusted[n].items():
            totals[ngram[:-1]] += count
            mass[ngram[:-1]] += discounts[min(count, 3)]
        for context, total in totals.items():
            backoffs[n - 1][context] = mass[context] / total
        for ngram, count in adjusted[n].items():
            context = ngram[:-1]
            lower = probs[n - 1][ngram[1:]] if n > 1 else base[ngram]
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


def _base_distribution(unigrams: dict, prior: Mapping[str, float] | None) -> dict:
    """The base probability of each unigram, ``{(word,): p}``; with a prior, its words are added to ``unigrams``
    (adjusted count 0: they get only their base share)."""
    if prior is None:
        return {ngram: 1.0 / len(unigrams) for ngram in unigrams}
    bad = [(w, v) for w, v in prior.items() if w == BOS or isinstance(v, bool) or not isinstance(v, (int, float))
           or not math.isfinite(v) or v <= 0]
    if bad or not prior:
        raise ValueError(f"the unigram prior needs finite weights > 0 and no {BOS}, got {bad[:3] or 'no word'}")
    for word in prior:
        unigrams.setdefault((word,), 0)
    floor = min(prior.values())
    weights = {ngram: prior.get(ngram[0], floor) for ngram in unigrams}
    total = math.fsum(weights.values())
    return {ngram: weight / total for ngram, weight in weights.items()}


def write_kneser_ney_arpa(text_file: str, arpa_path: str, order: int, common_word_count: int = 0,
                          spelling: bool = False) -> dict[str, int]:
    """Estimate the model (:func:`kneser_ney_arpa`) from the transcripts of a Kaldi ``text`` file
    (``key word word ...`` per line; the key is dropped) and write it atomically to ``arpa_path``. With
    ``common_word_count`` > 0 the unigrams' prior is that many English words
    (:func:`toolkit.text.common_words.common_words`), spelt with the transcripts' characters and upper-cased when
    the transcripts hold no lower-case letter.

    With ``spelling``, the spelling LM of :class:`WordNgramLM` instead: a letter n-gram model whose sentences are
    the distinct words of the transcripts (``<unk>`` left out) and the common words, each spelt letter by letter,
    so that it scores how English-like an unseen word's spelling is (as an ``<unk>`` model of letters, in the
    way Kaldi's ``utils/lang/make_unk_lm.sh`` models unknown words with phones).

    Returns:
        ``{"sentences": .., "words": .., "ngram 1": .., ...}`` (with ``spelling``: sentences are distinct words,
        words are letters).

    Raises:
        ValueError: as :func:`kneser_ney_arpa` (sentence N is line N), or the file is not UTF-8.
        OSError: ``text_file`` cannot be read or ``arpa_path`` written.
    """
    with open(text_file, encoding="utf-8") as f:
        sentences = [line.split()[1:] for line in f]
    prior = None
    if common_word_count:
        # NOTE: imported here: decoding imports this module, and only the estimate needs wordfreq (0.3 s to import).
        from toolkit.text.common_words import common_words

        alphabet = {c for words in sentences for w in words if w != UNK for c in w}
        prior = common_words(common_word_count, alphabet, upper=not any(c.islower() for c in alphabet))
    if spelling:
        words = sorted({w for words in sentences for w in words if w != UNK} | set(prior or ()))
        sentences, prior = [list(word) for word in words], None
    arpa = kneser_ney_arpa(sentences, order, prior)
    atomic_write(arpa_path, lambda out: out.write(arpa.encode("utf-8")))
    sizes = {line.split("=")[0]: int(line.split("=")[1]) for line in arpa.splitlines() if line.startswith("ngram ")}
    return {"sentences": sum(1 for s in sentences if s), "words": sum(len(s) for s in sentences),
            **({"common words": len(prior)} if prior else {}), **sizes}


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
    (:func:`toolkit.models.transformer.search.ctc_prefix_beam_search`, which calls :meth:`start`,
    :meth:`extend`, :meth:`bound` and :meth:`finish`).

    A hypothesis' LM score is ``weight * ln P(w1 .. wk </s>) + word_bonus * k + oov_penalty * (OOV words)``
    (natural log). A word is the units from one token starting with ``▁`` (char ``▁`` or SentencePiece ``▁X``) up to
    the next; it is scored once it is complete, when the next word starts or the hypothesis ends. Units are joined
    without ``▁``; a word missing from the LM's vocabulary (one holding ``<unk>`` too) scores as ``<unk>``, plus
    ``oov_penalty``. A prefix whose open word already begins no word of the LM competes with the penalty added from
    then on, so that misspellings leave the beam before they end (as pyctcdecode's partial-word score does), and
    ending such a word early gains nothing.

    With a spelling LM (a letter n-gram of words, :func:`write_kneser_ney_arpa` with ``spelling``), an OOV word w
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
            the units (an LM of text in another case or script).
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

    def _word(self, prefix: Sequence[int], start: int) -> str:
        return "".join(self.units[i] for i in prefix[start:]).replace(WORD_BOUNDARY, "")

    def _close_word(self, part: LMPart, prefix: Sequence[int]) -> tuple[float, kenlm.State]:
        """Fused score and state after the open word of ``part``; no change when it spells no character."""
        word = self._word(prefix, part.word_start)
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
        word = self._word((*prefix, token), part.word_start)
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
