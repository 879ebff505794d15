"""Decoding algorithms for the hybrid CTC/attention model.

- CTC greedy search: best token per frame, merge repeats, drop blanks (Graves et al., 2006).
- CTC prefix beam search: sum over alignments of each label prefix (Graves, 2012, "Supervised
  Sequence Labelling", section 7.5; Hannun et al., 2014, arXiv:1408.2873), optionally fused with a
  word n-gram LM (:class:`PrefixLM`); fed chunk by chunk for streaming (:class:`CtcPrefixBeamSearch`,
  partial hypotheses after each chunk), or a whole utterance at once (:func:`ctc_prefix_beam_search`).
- Attention beam search: left-to-right beam search with the attention decoder.
- Attention rescoring: CTC prefix beam n-best rescored by the attention decoder (as in WeNet,
  Yao et al., 2021, arXiv:2102.01547, section 2.2).
"""
import heapq
import math
from typing import Any, Callable, Iterable, NamedTuple, Protocol, Sequence

import torch

from toolkit.models.transformer.decoder import BiTransformerDecoder, TransformerDecoder
from toolkit.utils.common import BLANK_ID

NEG_INF = float("-inf")


def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) without overflow; -inf when both are -inf."""
    if a < b:
        a, b = b, a
    if b == NEG_INF:
        return a
    return a + math.log1p(math.exp(b - a))


def ctc_greedy_search(ctc_log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path decoding, batched.

    Args:
        ctc_log_probs: float32 (B, T_ctc, V) CTC log-posteriors (T_ctc = upsample x T' frames, see CTC).
        lengths: int64 (B,) valid CTC frames per utterance.

    Returns:
        B token-id lists (repeats merged, blanks removed), in batch order.
    """
    best = ctc_log_probs.argmax(dim=2).tolist()
    hyps = []
    for path, length in zip(best, lengths.tolist()):
        hyp = []
        previous = BLANK_ID
        for token in path[:length]:
            if token != previous and token != BLANK_ID:
                hyp.append(token)
            previous = token
        hyps.append(hyp)
    return hyps


class Hypothesis(NamedTuple):
    """One entry of a CTC prefix beam search n-best list: token ids, log P_ctc(tokens | x), and the fused LM
    score of the tokens (0.0 without an LM; see :class:`CtcPrefixBeamSearch` for what it holds in a partial
    n-best)."""
    tokens: list[int]
    ctc_score: float
    lm_score: float = 0.0


class Prefix(Sequence[int]):
    """A label prefix of CTC prefix beam search, as a node of a trie: its last token and the prefix one token
    shorter (``parent``), shared with every other prefix that extends it, so that extending a prefix, hashing it
    and telling the parent are O(1) whatever its length (a tuple costs O(length) for each, which made the search
    quadratic in the utterance's length).

    Two nodes holding the same tokens are equal and hash alike (the hash is computed once, from the parent's and
    the token; equality walks back from the ends to the first node they share): a prefix can leave the beam while
    its extension stays, and come back as a new node whose extension must meet the old one. As a ``Sequence[int]``
    of the token ids, ``len`` costs O(1) and reading item ``i`` or a slice from ``i`` costs O(length - i): read
    near the end (an LM's open word, its last n - 1 tokens); iterating reads the whole prefix.
    """
    __slots__ = ("parent", "token", "length", "_hash")

    def __init__(self, parent: "Prefix | None" = None, token: int = BLANK_ID):
        self.parent, self.token = parent, token  # the root (the empty prefix): no parent, token blank
        self.length = 0 if parent is None else parent.length + 1
        self._hash = hash(()) if parent is None else hash((parent._hash, token))

    def __len__(self) -> int:
        return self.length

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Prefix):
            return NotImplemented
        a, b = self, other
        while a is not b:
            if a._hash != b._hash or a.length != b.length or a.token != b.token:
                return False
            a, b = a.parent, b.parent
        return True

    def _tail(self, count: int) -> list[int]:
        """The last ``count`` tokens, last first."""
        tokens, node = [], self
        for _ in range(count):
            tokens.append(node.token)
            node = node.parent
        return tokens

    def __getitem__(self, index):
        if isinstance(index, slice):
            positions = range(*index.indices(self.length))
            if not positions:
                return ()
            low = min(positions[0], positions[-1])
            tail = self._tail(self.length - low)
            return tuple(tail[self.length - 1 - i] for i in positions)
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"prefix index {index} out of range for length {self.length}")
        return self._tail(self.length - index)[-1]

    def __iter__(self):
        return reversed(self._tail(self.length))

    def __reversed__(self):
        return iter(self._tail(self.length))

    def __repr__(self) -> str:
        return f"Prefix({list(self)})"


class PrefixLM(Protocol):
    """What :class:`CtcPrefixBeamSearch` needs of a language model for shallow fusion (implemented by
    :class:`toolkit.text.ngram_lm.WordNgramLM`): an opaque part per prefix, and its score. A part is a function of
    its prefix alone: the search computes it once per prefix, from the parent's, and carries it from frame to frame
    and chunk to chunk. ``prefix`` is a :class:`Prefix`: read it near its end (the open word), as reading it whole
    costs its length at every call, which makes the search quadratic in the utterance's length."""

    def start(self) -> Any:
        """The part of the empty prefix (its score is ``part.score``)."""

    def extend(self, part: Any, prefix: Sequence[int], token: int) -> Any:
        """The part of ``prefix + [token]`` from the part of ``prefix``."""

    def bound(self, part: Any) -> float:
        """An upper bound on the score of every one-token extension of the prefix whose part is ``part``."""

    def finish(self, part: Any, prefix: Sequence[int]) -> float:
        """The LM score of ``prefix`` as a complete hypothesis."""


class CtcPrefixBeamSearch:
    """Prefix beam search over one utterance fed chunk by chunk, optionally fused with a language model.

    Each prefix keeps two log-probabilities: all alignments so far ending in blank, and those ending in its last
    token; a repeated token extends the prefix only after a blank. Per frame only the ``beam_size`` most likely
    tokens are expanded. With ``lm`` (shallow fusion, as in Hannun et al., 2014, eq. 3), prefixes compete on
    log P_ctc + their LM score so far (``part.score``: the words they have completed), and the final n-best
    (:meth:`finish`) is ranked on log P_ctc + the LM score of the whole hypothesis (its last word and the end of
    sentence included); a new prefix is scored by the LM only once :meth:`PrefixLM.bound` says it could enter the
    beam (the same beam, with a fraction of the work).

    The search is frame-synchronous and its state (the beam's prefixes, their two log-probabilities and LM parts)
    is carried between calls, so feeding an utterance's frames in chunks of any size gives exactly the hypotheses
    and scores of feeding them at once. Time per frame is O(beam_size^2) whatever the number of frames fed (for
    words of bounded length with an LM: :class:`toolkit.text.ngram_lm.WordNgramLM` reads the open word).

    Partial results (the live captions' contract): :meth:`feed` returns the beam after the frames fed so far, best
    first, as :class:`Hypothesis` with the prefix's token ids, its ``ctc_score`` (log P_ctc of the prefix over the
    frames so far, summed over its alignments) and its ``lm_score``: the LM score it competes on (its completed
    words, plus the penalties :class:`toolkit.text.ngram_lm.WordNgramLM` gives an open word that begins no word of
    the LM), without its open word's score and the end of sentence, which only :meth:`finish` adds; 0.0 without an
    LM. The order is that of ``ctc_score + lm_score``. A partial's last word may still change or grow, and a later
    frame may replace the whole hypothesis.

    Args:
        beam_size: number of prefixes kept (and tokens expanded) per frame, >= 1.
        lm: language model to fuse, or None.

    Raises:
        ValueError: ``beam_size`` < 1.
    """

    def __init__(self, beam_size: int, lm: PrefixLM | None = None):
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        self.beam_size, self.lm = beam_size, lm
        root = Prefix()
        # prefix -> (log P of its alignments ending in blank, ... ending in its last token), best first
        self._beams: dict[Prefix, tuple[float, float]] = {root: (0.0, NEG_INF)}
        # The LM part of the beam's prefixes and of their extensions scored so far (a function of the prefix alone,
        # so computed once while the prefix can still be asked for; not of every prefix ever scored, which grows
        # with T).
        self._lm_parts: dict[Prefix, Any] = {root: lm.start()} if lm is not None else {}
        self._vocab_size: int | None = None
        self._token_lists_before: dict[Prefix, list[int]] = {}  # :meth:`_token_lists`

    def feed(self, ctc_log_probs: torch.Tensor) -> list[Hypothesis]:
        """Advance the search by the frames of one chunk.

        Args:
            ctc_log_probs: float32 (T_chunk, V) CTC log-posteriors of the chunk's valid CTC frames (T_chunk >= 0;
                V the same in every chunk).

        Returns:
            The partial n-best after these frames: up to ``beam_size`` hypotheses, best first (see the class).

        Raises:
            ValueError: ``ctc_log_probs`` is not 2-D, or its V differs from the previous chunk's.
        """
        if ctc_log_probs.dim() != 2:
            raise ValueError(f"ctc_log_probs must be (T_chunk, V), got shape {tuple(ctc_log_probs.shape)}")
        if self._vocab_size is None:
            self._vocab_size = ctc_log_probs.size(1)
        elif ctc_log_probs.size(1) != self._vocab_size:
            raise ValueError(f"ctc_log_probs has V = {ctc_log_probs.size(1)}, the previous chunks "
                             f"{self._vocab_size}")
        top_k = min(self.beam_size, ctc_log_probs.size(1))
        top_values, top_ids = ctc_log_probs.topk(top_k, dim=1)
        for values, ids in zip(top_values.tolist(), top_ids.tolist()):
            self._step(values, ids)
        return self._hypotheses(lambda part, prefix: part.score)

    def finish(self) -> list[Hypothesis]:
        """The n-best of the frames fed so far as complete hypotheses: with an LM, ``lm_score`` is the LM score of
        the whole hypothesis (its open word and the end of sentence included, :meth:`PrefixLM.finish`) and the
        list is ranked on ``ctc_score + lm_score``; without, the partial n-best of :meth:`feed`. Leaves the search
        as it is (feeding more frames goes on from the same beam).

        Returns:
            Up to ``beam_size`` hypotheses, best first.
        """
        if self.lm is None:
            return self._hypotheses(None)
        return sorted(self._hypotheses(self.lm.finish), key=lambda hyp: hyp.ctc_score + hyp.lm_score, reverse=True)

    def _hypotheses(self, lm_score: Callable[[Any, Prefix], float] | None) -> list[Hypothesis]:
        """The beam, best first, each prefix's LM score ``lm_score(part, prefix)`` (unused without an LM)."""
        token_lists = self._token_lists()
        if self.lm is None:
            return [Hypothesis(list(token_lists[prefix]), _log_add(*probs)) for prefix, probs in self._beams.items()]
        return [Hypothesis(list(token_lists[prefix]), _log_add(*probs), lm_score(self._lm_parts[prefix], prefix))
                for prefix, probs in self._beams.items()]

    def _token_lists(self) -> dict[Prefix, list[int]]:
        """The token ids of the beam's prefixes, each the previous call's list of its nearest ancestor plus the
        tokens after it: every prefix of the beam descends from one of the beam a chunk before, at most a chunk's
        frames back, so that returning the partial n-best after each chunk walks a chunk, not whole prefixes."""
        token_lists = {}
        for prefix in self._beams:
            tail, node = [], prefix
            while node.length and node not in self._token_lists_before:
                tail.append(node.token)
                node = node.parent
            token_lists[prefix] = self._token_lists_before.get(node, []) + tail[::-1]
        self._token_lists_before = token_lists
        return token_lists

    def _step(self, values: list[float], ids: list[int]) -> None:
        """One frame: ``values`` and ``ids`` are its ``top_k`` log-probabilities and token ids."""
        blank_log_p = None  # blank not among the frame's top_k
        tokens = []
        for log_p, token in zip(values, ids):
            if token == BLANK_ID:
                blank_log_p = log_p
            else:
                tokens.append((log_p, token))
        # A prefix ending in blank after this frame comes only from itself; one ending in a token from itself (a
        # repeat without blank) or from the prefix one token shorter.
        ending_blank: dict[Prefix, float] = {}
        ending_token: dict[Prefix, float] = {}
        for prefix, (p_blank, p_token) in self._beams.items():
            p_prefix = _log_add(p_blank, p_token)
            if blank_log_p is not None:
                ending_blank[prefix] = p_prefix + blank_log_p
            last = prefix.token  # the root's is blank, which no token of the frame's is
            for log_p, token in tokens:
                if token == last:
                    ending_token[prefix] = _log_add(ending_token.get(prefix, NEG_INF), p_token + log_p)
                    log_p += p_blank  # the repeat counts as a new token only after a blank
                else:
                    log_p += p_prefix
                extended = Prefix(prefix, token)
                ending_token[extended] = _log_add(ending_token.get(extended, NEG_INF), log_p)
        scores = {prefix: _log_add(ending_blank.get(prefix, NEG_INF), p) for prefix, p in ending_token.items()}
        for prefix, p in ending_blank.items():
            scores.setdefault(prefix, p)
        if self.lm is None:
            best = heapq.nlargest(self.beam_size, scores, key=scores.__getitem__)
        else:
            best = _best_with_lm(scores, self.beam_size, self.lm, self._lm_parts, self._beams)
        beams = self._beams = {prefix: (ending_blank.get(prefix, NEG_INF), ending_token.get(prefix, NEG_INF))
                               for prefix in best}
        if self.lm is not None:  # the next frame asks only for the beam's prefixes and their one-token extensions
            self._lm_parts = {prefix: part for prefix, part in self._lm_parts.items()
                              if prefix in beams or prefix.parent in beams}


def ctc_prefix_beam_search(ctc_log_probs: torch.Tensor, beam_size: int, lm: PrefixLM | None = None
                           ) -> list[Hypothesis]:
    """:class:`CtcPrefixBeamSearch` over a whole utterance: all its frames fed at once, then finished.

    Args:
        ctc_log_probs: float32 (T_ctc, V) CTC log-posteriors of the valid CTC frames only.
        beam_size: number of prefixes kept (and tokens expanded) per frame, >= 1.
        lm: language model to fuse, or None.

    Returns:
        Up to ``beam_size`` hypotheses, best first (:meth:`CtcPrefixBeamSearch.finish`).

    Raises:
        ValueError: ``beam_size`` < 1; ``ctc_log_probs`` not 2-D.
    """
    search = CtcPrefixBeamSearch(beam_size, lm)
    search.feed(ctc_log_probs)
    return search.finish()


def _best_with_lm(scores: dict[Prefix, float], beam_size: int, lm: PrefixLM, lm_parts: dict[Prefix, Any],
                  parents: Iterable[Prefix]) -> list[Prefix]:
    """The ``beam_size`` prefixes of ``scores`` (log P_ctc) with the highest log P_ctc + LM score, best first
    (equal totals in the order of ``scores``), extending the LM (into ``lm_parts``) only to the prefixes that can
    still make the cut: a prefix not yet in ``lm_parts`` (a one-token extension of one of ``parents``) competes on
    its parent's :meth:`PrefixLM.bound` until it reaches the top, and is then scored exactly and competes again.
    The same prefixes as scoring every one first, with a fraction of the LM's work."""
    ceilings = {parent: lm.bound(lm_parts[parent]) for parent in parents}
    heap = []
    for order, (prefix, p) in enumerate(scores.items()):
        part = lm_parts.get(prefix)
        if part is not None:
            heap.append((-(p + part.score), order, prefix, True))
        else:
            heap.append((-(p + ceilings[prefix.parent]), order, prefix, False))
    heapq.heapify(heap)
    best = []
    while heap and len(best) < beam_size:
        _, order, prefix, exact = heapq.heappop(heap)
        if exact:
            best.append(prefix)
        else:
            parent = prefix.parent
            part = lm_parts[prefix] = lm.extend(lm_parts[parent], parent, prefix.token)
            heapq.heappush(heap, (-(scores[prefix] + part.score), order, prefix, True))
    return best


def attention_beam_search(decoder: TransformerDecoder, memory: torch.Tensor,
                          memory_mask: torch.Tensor, sos: int, eos: int, beam_size: int,
                          length_penalty: float = 0.0) -> list[list[int]]:
    """Beam search with the attention decoder, batched over B * beam_size hypotheses.

    Each utterance is searched on its own terms, whatever else is in the batch:

    - Length limit: a hypothesis of an utterance with T'_b valid encoder frames holds at most
      T'_b tokens; at that length its only continuation is ``eos`` (with the decoder's own
      ``eos`` log-prob). So 0 valid frames (a clip under 7 fbank frames) give the empty output.
    - Ranking: hypotheses compete inside the beam on their summed log-probs (plus
      ``length_penalty`` per token); finished ones stay in the beam and can only be extended by
      ``eos`` at no cost. The final choice divides each score by its number of decoding steps
      (tokens + ``eos``), i.e. the mean log-prob per step: the length normalisation of Wu et al.,
      2016 (GNMT, arXiv:1609.08144, section 7) with exponent 1, fairseq's default
      (``--lenpen 1``). Raw sums favour stopping early: an ``eos`` at -3 would beat five tokens
      at -1 each, so an under-trained model decodes to empty outputs at wide beams.

    Args:
        decoder: attention decoder (``forward_one_step`` is used with its cache).
        memory: float32 (B, T', D) encoder output.
        memory_mask: bool (B, 1, T'), True at valid frames.
        sos, eos: start and end token ids.
        beam_size: hypotheses kept per utterance, >= 1.
        length_penalty: added to the score per emitted token, before the normalisation (> 0
            favours longer outputs; 0, the default, leaves the normalised log-prob alone).

    Returns:
        B token-id lists without ``sos``/``eos``, in batch order.
    """
    batch = memory.size(0)
    if batch == 0:
        return []
    device = memory.device
    limits = memory_mask.view(batch, -1).sum(dim=1).repeat_interleave(beam_size).unsqueeze(1)
    memory = memory.repeat_interleave(beam_size, dim=0)
    memory_mask = memory_mask.repeat_interleave(beam_size, dim=0)
    hyps = torch.full((batch * beam_size, 1), sos, dtype=torch.long, device=device)
    # Only the first copy of each utterance is live at the start, so the first expansion does
    # not fill the beam with duplicates.
    scores = torch.full((batch, beam_size), NEG_INF, device=device)
    scores[:, 0] = 0.0
    scores = scores.view(-1, 1)
    finished = torch.zeros(batch * beam_size, 1, dtype=torch.bool, device=device)
    base = (torch.arange(batch, device=device) * beam_size).unsqueeze(1)
    cache: list[torch.Tensor] | None = None
    for step in range(int(limits.max()) + 1):  # up to T'_b tokens, then eos
        if bool(finished.all()):
            break
        log_probs, cache = decoder.forward_one_step(memory, memory_mask, hyps, cache)
        only_eos = torch.full_like(log_probs, NEG_INF)
        only_eos[:, eos] = log_probs[:, eos]
        log_probs = torch.where(limits <= step, only_eos, log_probs)
        top_k = min(beam_size, log_probs.size(1))
        top_log_probs, top_ids = log_probs.topk(top_k, dim=1)
        top_log_probs = top_log_probs + length_penalty * (top_ids != eos)
        # A finished hypothesis has exactly one continuation: eos with log-prob 0.
        done_scores = torch.full_like(top_log_probs, NEG_INF)
        done_scores[:, 0] = 0.0
        top_log_probs = torch.where(finished, done_scores, top_log_probs)
        top_ids = top_ids.masked_fill(finished, eos)
        candidates = (scores + top_log_probs).view(batch, beam_size * top_k)
        best_scores, best_offsets = candidates.topk(beam_size, dim=1)
        source = (best_offsets // top_k + base).view(-1)
        tokens = top_ids.view(batch, beam_size * top_k).gather(1, best_offsets).view(-1, 1)
        hyps = torch.cat([hyps[source], tokens], dim=1)
        cache = [layer_cache[source] for layer_cache in cache]
        scores = best_scores.view(-1, 1)
        finished = tokens == eos
    # Decoding steps of each hypothesis: its tokens plus the eos (every one has ended here).
    steps = ((hyps[:, 1:] != eos).cumprod(dim=1).sum(dim=1) + 1).view(batch, beam_size)
    best = (scores.view(batch, beam_size) / steps).argmax(dim=1) + base.squeeze(1)
    results = []
    for row in hyps[best, 1:].tolist():
        results.append(row[: row.index(eos)] if eos in row else row)
    return results


def attention_rescoring(decoder: TransformerDecoder | BiTransformerDecoder, memory: torch.Tensor,
                        memory_mask: torch.Tensor, nbest: list[Hypothesis],
                        sos: int, eos: int, ctc_weight: float,
                        length_penalty: float = 0.0, reverse_weight: float = 0.0) -> list[int]:
    """Pick the best of a CTC n-best list for one utterance with one teacher-forced decoder pass (per direction).

    score = log P_att(hyp + eos | x) + ctc_weight * log P_ctc(hyp | x) + LM score + length_penalty * |hyp|
    (the LM score is the n-best's own, 0.0 when the search had no LM); with U2++'s right-to-left decoder
    (Wu et al., 2021, arXiv:2106.05642) log P_att is (1 - reverse_weight) * the left-to-right decoder's
    log P(hyp + eos | x) + reverse_weight * the right-to-left one's log P(reversed hyp + eos | x).

    Args:
        decoder: attention decoder (a BiTransformerDecoder when ``reverse_weight`` > 0).
        memory: float32 (1, T', D) encoder output of the utterance.
        memory_mask: bool (1, 1, T'), True at valid frames.
        nbest: hypotheses from :func:`ctc_prefix_beam_search`.
        sos, eos: start and end token ids.
        ctc_weight: weight of the CTC prefix score.
        length_penalty: added per token.
        reverse_weight: weight of the right-to-left score, in [0, 1].

    Returns:
        The best token-id list.

    Raises:
        ValueError: empty ``nbest``.
    """
    if not nbest:
        raise ValueError("attention_rescoring needs a non-empty n-best list")
    device = memory.device
    count = len(nbest)
    lengths = torch.tensor([len(hyp.tokens) for hyp in nbest], device=device)
    width = int(lengths.max()) + 1
    memory = memory.expand(count, -1, -1)
    memory_mask = memory_mask.expand(count, -1, -1)
    # Steps after each hypothesis' eos are padding.
    valid = torch.arange(width, device=device).unsqueeze(0) <= lengths.unsqueeze(1)

    def teacher_forced_scores(sequences: list[list[int]], forward) -> torch.Tensor:
        ys_in = torch.full((count, width), eos, dtype=torch.long, device=device)
        ys_out = torch.full((count, width), eos, dtype=torch.long, device=device)
        ys_in[:, 0] = sos
        for i, tokens in enumerate(sequences):
            ys_in[i, 1: len(tokens) + 1] = torch.tensor(tokens, dtype=torch.long)
            ys_out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        token_scores = forward(memory, memory_mask, ys_in, lengths + 1).log_softmax(dim=2)
        return token_scores.gather(2, ys_out.unsqueeze(2)).squeeze(2).masked_fill(~valid, 0.0).sum(dim=1)

    att_scores = teacher_forced_scores([hyp.tokens for hyp in nbest], decoder)
    if reverse_weight > 0.0:
        r_scores = teacher_forced_scores([hyp.tokens[::-1] for hyp in nbest], decoder.forward_reverse)
        att_scores = (1.0 - reverse_weight) * att_scores + reverse_weight * r_scores
    ctc_scores = torch.tensor([hyp.ctc_score for hyp in nbest], device=device)
    lm_scores = torch.tensor([hyp.lm_score for hyp in nbest], device=device)
    total = att_scores + ctc_weight * ctc_scores + lm_scores + length_penalty * lengths
    return nbest[int(total.argmax())].tokens
