"""CTC forced alignment: the single most probable CTC path (Viterbi) that spells a given token sequence, the frames
where each token is emitted (Graves et al., 2006, "Connectionist Temporal Classification", section 4.1's extended
label sequence with blanks between labels, maximised instead of summed)."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from toolkit.utils.common import BLANK_ID


class TokenSpan(NamedTuple):
    """Where the best path emits one token: CTC frames ``start`` to ``end`` (exclusive), and its posterior
    probability at its most probable frame among them, in [0, 1]."""
    start: int
    end: int
    posterior: float


def ctc_forced_align(log_probs: torch.Tensor, tokens: Sequence[int]) -> list[TokenSpan] | None:
    """The Viterbi CTC path of ``tokens`` through ``log_probs``.

    Args:
        log_probs: float32 (T, V) CTC log-posteriors of one utterance's valid frames.
        tokens: the L token ids to align (no blank).

    Returns:
        L spans, one per token in order; None when no path spells ``tokens`` in T frames (T < L + the number of
        adjacent repeated tokens, which need a blank between them).
    """
    lp = log_probs.detach().cpu().double().numpy()
    num_frames, num_tokens = lp.shape[0], len(tokens)
    if num_tokens == 0:
        return []
    ext = np.full(2 * num_tokens + 1, BLANK_ID, dtype=np.int64)  # blank, y1, blank, y2, ..., blank
    ext[1::2] = tokens
    # a label state may come from two states back when it differs from the label there (no repeat across a skip)
    skip = np.zeros(ext.size, dtype=bool)
    skip[3::2] = ext[3::2] != ext[1:-2:2]
    score = np.full(ext.size, -np.inf)
    score[:2] = lp[0, ext[:2]]
    back = np.zeros((num_frames, ext.size), dtype=np.int8)  # 0: stay, 1: from s-1, 2: from s-2
    for t in range(1, num_frames):
        stay, step, jump = score, np.concatenate([[-np.inf], score[:-1]]), np.concatenate([[-np.inf] * 2, score[:-2]])
        jump = np.where(skip, jump, -np.inf)
        choices = np.stack([stay, step, jump])
        back[t] = choices.argmax(axis=0)
        score = choices.max(axis=0) + lp[t, ext]
    final = ext.size - 1 if score[-1] >= score[-2] else ext.size - 2
    if not np.isfinite(score[final]):
        return None
    states = np.empty(num_frames, dtype=np.int64)
    states[-1] = final
    for t in range(num_frames - 1, 0, -1):
        states[t - 1] = states[t] - back[t, states[t]]
    spans = []
    for i in range(num_tokens):
        frames = np.flatnonzero(states == 2 * i + 1)
        spans.append(TokenSpan(int(frames[0]), int(frames[-1]) + 1, float(np.exp(lp[frames, tokens[i]].max()))))
    return spans
