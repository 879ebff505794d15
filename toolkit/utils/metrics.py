"""Edit-distance counts for WER and CER: the one scoring function of the toolkit.

``tools/compute_wer.py`` (files, offline) and ``toolkit.bin.recognize`` (in the decoding job, every rank counting
its own utterances) both score through :func:`utterance_counts`, so the two agree to the count.

Per utterance, the reference and the hypothesis are whitespace- and Unicode-normalised (:func:`normalize`; NFC,
:mod:`toolkit.utils.unicode_text`, so the same words in composed and decomposed form are equal) and aligned by
Levenshtein distance (jiwer's ``process_words``; ``process_characters`` for CER, where the single space between
two words counts as a character). The alignment gives N reference units, C correct, S substituted, D deleted and I
inserted units, with N = C + S + D. Counts of a corpus are sums of utterance counts, so partial sums (one per rank)
add up exactly; the error rate is computed once from the sums, 100 (S + D + I) / N percent, never averaged from
partial rates (that would weight ranks or utterances instead of words).

A reference with no hypothesis scores as N deletions; a hypothesis with no reference is reported and ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import jiwer

from toolkit.utils.unicode_text import normalize_unicode

COUNT_NAMES = ("N", "C", "S", "D", "I")
UNITS = ("word", "char")
RATE_NAMES = {"word": "WER", "char": "CER"}


@dataclass(frozen=True)
class ErrorCounts:
    """Alignment counts in units of words or characters: N reference units, C correct, S substitutions,
    D deletions, I insertions (all int, N = C + S + D)."""

    N: int = 0
    C: int = 0
    S: int = 0
    D: int = 0
    I: int = 0  # noqa: E741 (the field's standard letter)

    def __add__(self, other: "ErrorCounts") -> "ErrorCounts":
        return ErrorCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return dataclasses.astuple(self)

    @property
    def errors(self) -> int:
        return self.S + self.D + self.I

    @property
    def error_rate(self) -> float | None:
        """100 (S + D + I) / N in percent; None when N = 0 (undefined: there is nothing to get wrong, and any
        insertion would make it infinite)."""
        return 100.0 * self.errors / self.N if self.N else None


def sum_counts(counts: Iterable[ErrorCounts]) -> ErrorCounts:
    total = ErrorCounts()
    for c in counts:
        total = total + c
    return total


def normalize(text: str) -> str:
    """Unicode NFC, every run of whitespace collapsed to one space and the ends stripped (so ``"A  B "`` scores as
    ``"A B"``, and ``"E\u0301"`` as ``"\u00c9"``)."""
    return " ".join(normalize_unicode(text).split())


def _chunk_counts(chunks) -> ErrorCounts:
    counts = dict.fromkeys(("C", "S", "D", "I"), 0)
    op_to_count = {"equal": "C", "substitute": "S", "delete": "D"}
    for chunk in chunks:
        if chunk.type == "insert":
            counts["I"] += chunk.hyp_end_idx - chunk.hyp_start_idx
        else:
            counts[op_to_count[chunk.type]] += chunk.ref_end_idx - chunk.ref_start_idx
    return ErrorCounts(N=counts["C"] + counts["S"] + counts["D"], **counts)


def utterance_counts(refs: Sequence[str], hyps: Sequence[str], unit: str = "word") -> list[ErrorCounts]:
    """Counts of each (reference, hypothesis) pair, in order.

    Args:
        refs, hyps: equally long lists of transcripts (normalised here); an empty hypothesis scores every
            reference unit as a deletion, an empty reference every hypothesis unit as an insertion.
        unit: ``"word"`` (WER) or ``"char"`` (CER).

    Raises:
        ValueError: ``unit`` not in :data:`UNITS`, or lists of different lengths.
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    if not refs:
        return []
    process = jiwer.process_words if unit == "word" else jiwer.process_characters
    alignments = process([normalize(r) for r in refs], [normalize(h) for h in hyps]).alignments
    return [_chunk_counts(chunks) for chunks in alignments]


@dataclass
class Score:
    """Result of :func:`score`.

    Attributes:
        totals: corpus counts (sums over the reference keys).
        per_utt: ``{key: ErrorCounts}`` for every reference key, in reference order.
        missing: reference keys without a hypothesis (scored as deletions), in reference order.
        extra: hypothesis keys without a reference (ignored), in hypothesis order.
    """

    totals: ErrorCounts
    per_utt: dict[str, ErrorCounts]
    missing: list[str]
    extra: list[str]


def score(ref: Mapping[str, str], hyp: Mapping[str, str], unit: str = "word") -> Score:
    """Score hypotheses against references, matched by utterance key (each key once: mappings de-duplicate).

    Raises:
        ValueError: unknown ``unit``.
    """
    keys = list(ref)
    per_utt = dict(zip(keys, utterance_counts([ref[k] for k in keys], [hyp.get(k, "") for k in keys], unit)))
    return Score(totals=sum_counts(per_utt.values()), per_utt=per_utt, missing=[k for k in keys if k not in hyp],
                 extra=[k for k in hyp if k not in ref])


def format_report(counts: ErrorCounts, unit: str = "word") -> str:
    """Two lines: ``N=.. C=.. S=.. D=.. I=..`` and ``WER 12.34 % [ S+D+I / N ]`` (CER for ``char``); the rate
    reads ``undefined`` when N = 0."""
    rate = counts.error_rate
    shown = "undefined" if rate is None else f"{rate:.2f} %"
    return (" ".join(f"{name}={value}" for name, value in zip(COUNT_NAMES, counts.as_tuple())) + "\n"
            + f"{RATE_NAMES[unit]} {shown} [ {counts.errors} / {counts.N} ]\n")
