"""ctc_forced_align is the best CTC path of the tokens: its score equals the maximum over every path of T frames
that collapses to them (enumerated), and each span is where that path emits its token."""

import itertools

import pytest
import torch

from toolkit.models.transformer.alignment import ctc_forced_align
from toolkit.utils.common import BLANK_ID


def _collapse(path):
    out, last = [], None
    for p in path:
        if p != last and p != BLANK_ID:
            out.append(p)
        last = p
    return out


@pytest.mark.parametrize("tokens", [[1, 2], [2, 2], [1, 2, 1], [3]])
def test_the_alignment_is_the_best_path_of_the_tokens(tokens):
    torch.manual_seed(len(tokens) * 7 + tokens[0])
    log_probs = torch.randn(7, 4).log_softmax(dim=1)
    best, best_path = -float("inf"), None
    for path in itertools.product(range(4), repeat=7):
        if _collapse(path) == tokens:
            score = sum(float(log_probs[t, p]) for t, p in enumerate(path))
            if score > best:
                best, best_path = score, path
    spans = ctc_forced_align(log_probs, tokens)
    emitted = [(t, p) for t, p in enumerate(best_path) if p != BLANK_ID]
    # the frames of each token on the enumerated best path: runs of the same label, one run per token
    runs, previous = [], None
    for t, p in enumerate(best_path):
        if p == BLANK_ID:
            previous = None
            continue
        if p != previous:
            runs.append([t, t + 1, p])
        else:
            runs[-1][1] = t + 1
        previous = p
    assert [(s.start, s.end) for s in spans] == [(a, b) for a, b, _ in runs], (best_path, spans)
    assert emitted and [p for _, _, p in runs] == tokens
    for span, (a, b, p) in zip(spans, runs):
        assert span.posterior == pytest.approx(float(log_probs[a:b, p].max().exp()), rel=1e-6)


def test_tokens_that_do_not_fit_the_frames_have_no_alignment():
    log_probs = torch.randn(3, 4).log_softmax(dim=1)
    assert ctc_forced_align(log_probs, [1, 1, 2]) is None  # 3 tokens with a repeat need 4 frames
    assert len(ctc_forced_align(log_probs, [1, 2, 3])) == 3
    assert ctc_forced_align(log_probs, []) == []
