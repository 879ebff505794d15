"""Estimation of word n-gram language models for decoding (:mod:`toolkit.text.ngram_lm` queries them): from
training transcripts into an ARPA file (``tools/train_ngram_lm.py``).

Estimation is interpolated modified Kneser-Ney (Chen & Goodman, 1998, "An Empirical Study of Smoothing Techniques
for Language Modeling", TR-10-98, sections 3.5-3.6 and 4.1.6), written in the backoff form of the ARPA format
(every probability already interpolated, each backoff weight the context's interpolation weight), as KenLM's
``lmplz`` writes it. It lives here because ``lmplz`` is not installable from PyPI (the ``kenlm`` package builds
only the query module; ``lmplz`` needs Boost), and the pure-Python ``arpabo`` 0.3.0 writes every backoff weight as
1, an unnormalised model.

The same estimate over words spelt letter by letter gives the spelling LM that scores the words the word LM lacks.

Sentences are padded as ``<s> w1 .. wk </s>``; words are case-sensitive and whitespace-separated. The unigram
level interpolates with a base distribution: uniform over the vocabulary (``<unk>`` gets only its share of it; an
out-of-vocabulary word scores as ``<unk>``), or a prior over a larger word list, such as a language's most frequent
words (:func:`toolkit.text.common_words.common_words`), which puts those words in the LM's vocabulary with their
share of the mass that Kneser-Ney keeps back for words not seen in the text (the same recursion: every distribution
still sums to one).
"""
from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

from toolkit.text.common_words import common_words
from toolkit.text.ngram_lm import BOS, EOS, MAX_ORDER, MIN_ORDER
from toolkit.text.tokenizer import UNK
from toolkit.utils.checkpoint import atomic_write
from toolkit.utils.unicode_text import normalize_unicode

# Used, with a warning, where an order's counts of counts cannot give the modified Kneser-Ney discounts (too
# little text; lmplz's --discount_fallback takes the same values).
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


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
    (``key word word ...`` per line; the key is dropped; the text Unicode-normalised to NFC, as everywhere in the
    toolkit, :mod:`toolkit.utils.unicode_text`) and write it atomically to ``arpa_path``. With
    ``common_word_count`` > 0 the unigrams' prior is that many English words
    (:func:`toolkit.text.common_words.common_words`), spelt with the transcripts' characters and upper-cased when
    the transcripts hold no lower-case letter.

    With ``spelling``, the spelling LM of :class:`toolkit.text.ngram_lm.WordNgramLM` instead: a letter n-gram model
    whose sentences are the distinct words of the transcripts (``<unk>`` left out) and the common words, each spelt
    letter by letter, so that it scores how English-like an unseen word's spelling is (as an ``<unk>`` model of
    letters, in the way Kaldi's ``utils/lang/make_unk_lm.sh`` models unknown words with phones).

    Returns:
        ``{"sentences": .., "words": .., "ngram 1": .., ...}`` (with ``spelling``: sentences are distinct words,
        words are letters).

    Raises:
        ValueError: as :func:`kneser_ney_arpa` (sentence N is line N), or the file is not UTF-8.
        OSError: ``text_file`` cannot be read or ``arpa_path`` written.
    """
    with open(text_file, encoding="utf-8") as f:
        sentences = [normalize_unicode(line).split()[1:] for line in f]
    prior = None
    if common_word_count:
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
