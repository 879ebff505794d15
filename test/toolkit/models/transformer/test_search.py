import math

import pytest
import torch

from toolkit.models.transformer.decoder import BiTransformerDecoder, TransformerDecoder
from toolkit.models.transformer.search import (CtcPrefixBeamSearch, Hypothesis, Prefix, attention_beam_search,
                                               attention_rescoring, ctc_greedy_search, ctc_prefix_beam_search)
from toolkit.text.kneser_ney import kneser_ney_arpa
from toolkit.text.ngram_lm import WordNgramLM


def test_greedy_merges_repeats_and_drops_blanks_within_length():
    # Best path per frame: a a _ a b b | b (last frame is padding).
    path = torch.tensor([[1, 1, 0, 1, 2, 2, 2]])
    log_probs = torch.nn.functional.one_hot(path, 3).float().log()
    assert ctc_greedy_search(log_probs, torch.tensor([6])) == [[1, 1, 2]]


def test_greedy_and_prefix_beam_search_disagree_on_a_hand_computed_case():
    # Tokens: 0 = blank, 1 = a, 2 = b; the same posteriors at both frames:
    #   P(blank) = 0.5, P(a) = 0.4, P(b) = 0.1.
    # Greedy picks the best path "blank blank" (0.25) -> "".
    # Summed over alignments:
    #   P("a") = aa + a_ + _a = 0.16 + 0.20 + 0.20 = 0.56
    #   P("")  = __           = 0.25
    #   P("b") = bb + b_ + _b = 0.01 + 0.05 + 0.05 = 0.11
    #   P("ab") = P("ba") = 0.04 (pruned by a beam of 3)
    frame = [0.5, 0.4, 0.1]
    log_probs = torch.tensor([frame, frame]).log()

    assert ctc_greedy_search(log_probs.unsqueeze(0), torch.tensor([2])) == [[]]

    nbest = ctc_prefix_beam_search(log_probs, beam_size=3)
    assert [hyp.tokens for hyp in nbest] == [[1], [], [2]]
    for hyp, expected in zip(nbest, [0.56, 0.25, 0.11]):
        assert math.isclose(hyp.ctc_score, math.log(expected), rel_tol=1e-6) and hyp.lm_score == 0.0


def test_prefix_beam_search_keeps_blank_separated_repeats():
    # a _ a with certainty -> "a a"; a a (no blank) collapses to "a".
    certain = torch.nn.functional.one_hot(torch.tensor([1, 0, 1]), 3).float().log()
    assert ctc_prefix_beam_search(certain, beam_size=2)[0] == Hypothesis([1, 1], 0.0, 0.0)
    merged = torch.nn.functional.one_hot(torch.tensor([1, 1]), 3).float().log()
    assert ctc_prefix_beam_search(merged, beam_size=2)[0] == Hypothesis([1], 0.0, 0.0)


def test_prefix_beam_search_scores_are_the_ctc_likelihoods_when_nothing_is_pruned():
    # 6 frames over blank, a, b: every labelling of up to 6 letters fits a beam of 200, so the n-best is all of
    # them, each scored with its exact log P_ctc (torch's CTC loss sums the same alignments), summing to one.
    torch.manual_seed(0)
    log_probs = torch.randn(6, 3).mul(2).log_softmax(dim=1)
    nbest = ctc_prefix_beam_search(log_probs, beam_size=200)
    # All 127 labellings of length 0..6 over 2 letters; those needing more frames (a repeat takes a blank between)
    # score -inf, as their CTC loss is infinite.
    assert len(nbest) == 127 and sum(hyp.ctc_score == -math.inf for hyp in nbest) > 0
    total = 0.0
    for hyp in nbest:
        expected = -torch.nn.functional.ctc_loss(log_probs.unsqueeze(1), torch.tensor([hyp.tokens]),
                                                 torch.tensor([6]), torch.tensor([len(hyp.tokens)]),
                                                 reduction="sum")
        assert math.isclose(hyp.ctc_score, float(expected), rel_tol=1e-5, abs_tol=1e-5), hyp
        total += math.exp(hyp.ctc_score)
    assert math.isclose(total, 1.0, rel_tol=1e-5)
    scores = [hyp.ctc_score for hyp in nbest]
    assert scores == sorted(scores, reverse=True) and nbest[0].lm_score == 0.0


def test_attention_rescoring_combines_decoder_ctc_and_length_scores():
    torch.manual_seed(0)
    decoder = TransformerDecoder(6, 16, attention_heads=2, linear_units=32, num_blocks=1).eval()
    memory = torch.randn(1, 5, 16)
    mask = torch.ones(1, 1, 5, dtype=torch.bool)
    short, long = [1], [1, 2, 3, 4]
    with torch.no_grad():
        # A large per-token bonus or penalty decides between a 1- and a 4-token hypothesis.
        assert attention_rescoring(decoder, memory, mask, [Hypothesis(short, 0.0), Hypothesis(long, 0.0)],
                                   5, 5, ctc_weight=0.5, length_penalty=100.0) == long
        assert attention_rescoring(decoder, memory, mask, [Hypothesis(short, 0.0), Hypothesis(long, 0.0)],
                                   5, 5, ctc_weight=0.5, length_penalty=-100.0) == short
        # The n-best's LM score is added as it is (the search weighted it already).
        for loser in (short, long):
            nbest = [Hypothesis(h, 0.0, -1000.0 if h == loser else 0.0) for h in (short, long)]
            assert attention_rescoring(decoder, memory, mask, nbest, 5, 5, ctc_weight=0.5) != loser
        # A dominant CTC score wins only when it is weighted in.
        nbest = [Hypothesis(short, -1000.0), Hypothesis(long, 0.0)]
        assert attention_rescoring(decoder, memory, mask, nbest, 5, 5, ctc_weight=1.0) == long
        logits = decoder(memory.expand(2, -1, -1), mask.expand(2, -1, -1),
                         torch.tensor([[5, 1, 5, 5, 5], [5, 1, 2, 3, 4]]), torch.tensor([2, 5]))
        log_probs = logits.log_softmax(dim=-1)
        att_short = log_probs[0, 0, 1] + log_probs[0, 1, 5]
        att_long = sum(log_probs[1, i, t] for i, t in enumerate([1, 2, 3, 4, 5]))
        expected = short if att_short > att_long else long
        assert attention_rescoring(decoder, memory, mask, nbest, 5, 5, ctc_weight=0.0) == expected


def test_attention_rescoring_weighs_the_right_to_left_decoder_by_reverse_weight():
    torch.manual_seed(0)
    decoder = BiTransformerDecoder(6, 16, attention_heads=2, linear_units=32, num_blocks=1, r_num_blocks=1).eval()
    memory = torch.randn(1, 5, 16)
    mask = torch.ones(1, 1, 5, dtype=torch.bool)
    sos = eos = 5
    hyps = [[1, 2], [2, 1], [3, 4], [4, 3], [2, 2], [1, 3], [3, 1]]  # one length: the directions decide
    nbest = [Hypothesis(h, -0.01 * i) for i, h in enumerate(hyps)]

    def score(forward, tokens: list[int]) -> float:
        """log P(tokens + eos | x), one decoder pass per hypothesis, written out."""
        ys_in = torch.tensor([[sos] + tokens])
        log_probs = forward(memory, mask, ys_in, torch.tensor([len(tokens) + 1])).log_softmax(dim=-1)
        return sum(float(log_probs[0, i, t]) for i, t in enumerate(tokens + [eos]))

    with torch.no_grad():
        left = [score(decoder, h) for h in hyps]
        right = [score(decoder.forward_reverse, h[::-1]) for h in hyps]
        picks = set()
        for weight in (0.0, 0.3, 0.7, 1.0):
            totals = [(1 - weight) * l + weight * r + 0.5 * hyp.ctc_score for l, r, hyp in zip(left, right, nbest)]
            expected = hyps[max(range(len(hyps)), key=totals.__getitem__)]
            assert attention_rescoring(decoder, memory, mask, nbest, sos, eos, ctc_weight=0.5,
                                       reverse_weight=weight) == expected
            picks.add(tuple(expected))
        # the right-to-left decoder reads the reversed tokens: [1, 2] scores as [2, 1] does left to right
        assert right[0] == pytest.approx(score(decoder.right_decoder, [2, 1]), abs=1e-6)
    assert len(picks) > 1  # the weight changed the pick: the test tells the two directions apart


def test_prefix_beam_search_with_a_word_lm_prefers_the_words_it_knows(tmp_path):
    # Units: 0 blank, 1 <unk>, 2 S, 3 I, 4 E, 5 X, 6 ▁. Frames: S, then E a little likelier than I, then X.
    # The LM knows SIX only, so SEX is <unk> to it: with the LM, SIX wins; without it, SEX.
    units = {0: "<blank>", 1: "<unk>", 2: "S", 3: "I", 4: "E", 5: "X", 6: "\u2581"}
    path = tmp_path / "lm.arpa"
    path.write_text(kneser_ney_arpa([["SIX"], ["SIX", "SIX"], ["SIX", "SIX", "SIX"]], order=2), encoding="utf-8")
    frames = [[0.02, 0.0, 0.96, 0.0, 0.0, 0.0, 0.02], [0.1, 0.0, 0.0, 0.4, 0.5, 0.0, 0.0],
              [0.02, 0.0, 0.0, 0.0, 0.0, 0.96, 0.02]]
    log_probs = torch.tensor(frames).clamp(min=1e-6).log()
    assert ctc_prefix_beam_search(log_probs, beam_size=4)[0].tokens == [2, 4, 5]
    fused = ctc_prefix_beam_search(log_probs, beam_size=4, lm=WordNgramLM(str(path), units, 0.5, 0.0))
    assert fused[0].tokens == [2, 3, 5]
    # Each score is log P_ctc plus the LM's, and the list is ranked on their sum.
    assert all(a.ctc_score + a.lm_score >= b.ctc_score + b.lm_score for a, b in zip(fused, fused[1:]))
    assert fused[0].ctc_score < [h for h in fused if h.tokens == [2, 4, 5]][0].ctc_score
    # Weight 0 and no bonus: the LM changes nothing.
    plain = ctc_prefix_beam_search(log_probs, beam_size=4)
    assert ctc_prefix_beam_search(log_probs, 4, WordNgramLM(str(path), units, 0.0, 0.0)) == plain


class _ScriptedDecoder:
    """Stands in for the attention decoder in :func:`attention_beam_search`: fixed log-probs per prefix."""

    def __init__(self, vocab: int, scores):
        self.vocab = vocab
        self.scores = scores  # prefix (list of tokens after sos) -> {token: log-prob}; others get -20

    def forward_one_step(self, memory, memory_mask, hyps, cache):
        out = torch.full((hyps.size(0), self.vocab), -20.0)
        for i, row in enumerate(hyps[:, 1:].tolist()):
            for token, value in self.scores(row).items():
                out[i, token] = value
        return out, [torch.zeros(hyps.size(0), hyps.size(1), 2)]


def test_an_immediate_eos_does_not_win_the_beam():
    # <eos> at step 1 costs -3.0; the right output is 5 tokens at -1.0 each, then <eos> at -0.1 (-5.1 in all). Raw
    # sums prefer the empty output at every beam wider than 1; per-step means (-3.0 vs -0.85) do not.
    eos, correct = 7, [1, 2, 3, 4, 5]

    def scores(prefix):
        k = len(prefix)
        if prefix != correct[:k]:
            return {}
        if k == 5:
            return {eos: -0.1}
        return {correct[k]: -1.0, 6: -1.5, eos: -3.0 if k == 0 else -8.0}

    memory, mask = torch.zeros(1, 50, 4), torch.ones(1, 1, 50, dtype=torch.bool)
    for beam in (1, 4, 10):
        assert attention_beam_search(_ScriptedDecoder(8, scores), memory, mask, 0, eos, beam) == [correct]


def test_each_utterance_is_limited_by_its_own_encoder_length():
    # A decoder that never wants to stop (eos at -10, token 1 at -0.1): each output is as long as its own utterance's
    # valid encoder frames, whatever the padded length; 0 frames give the empty output.
    eos = 3
    decoder = _ScriptedDecoder(4, lambda prefix: {1: -0.1, 2: -0.5, eos: -10.0})
    lengths = torch.tensor([9, 4, 0])
    mask = (torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1)
    batched = attention_beam_search(decoder, torch.zeros(3, 9, 4), mask, 0, eos, beam_size=3)
    assert [len(hyp) for hyp in batched] == [9, 4, 0]
    for i, length in enumerate(lengths.tolist()):
        alone = attention_beam_search(decoder, torch.zeros(1, length, 4), mask[i:i + 1, :, :length], 0, eos, 3)
        assert alone == [batched[i]]


class _EagerLM:
    """A word LM whose bound promises nothing (1e30, above any score; inf would make -inf + inf): the search then
    scores every candidate prefix exactly, as before it had bounds; counts the LM's extensions."""

    def __init__(self, lm):
        self.lm, self.extends = lm, 0

    def start(self):
        return self.lm.start()

    def extend(self, part, prefix, token):
        self.extends += 1
        return self.lm.extend(part, prefix, token)

    def bound(self, part):
        return 1e30

    def finish(self, part, prefix):
        return self.lm.finish(part, prefix)


def _letters_lm(tmp_path, word_bonus: float) -> WordNgramLM:
    units = {0: "<blank>", 1: "<unk>", 2: "A", 3: "B", 4: "C", 5: "D", 6: "E", 7: "\u2581"}
    sentences = [["BAD", "CAB"], ["DAD", "BED", "CAB"], ["ACE", "BAD"], ["BEAD", "DEAD", "BAD"], ["CAB", "CAB"]]
    (tmp_path / "lm.arpa").write_text(kneser_ney_arpa(sentences, order=3), encoding="utf-8")
    words = sorted({w for s in sentences for w in s})
    (tmp_path / "spelling.arpa").write_text(kneser_ney_arpa([list(w) for w in words], order=3), encoding="utf-8")
    return WordNgramLM(str(tmp_path / "lm.arpa"), units, 0.5, word_bonus, oov_penalty=-1.0,
                       spelling_path=str(tmp_path / "spelling.arpa"))


def test_the_lm_bound_prunes_extensions_without_changing_the_n_best(tmp_path):
    # Only candidates whose bound can still make the cut are scored by the LM; the n-best (tokens, both scores,
    # order) is the one of scoring every candidate, on peaky and flat posteriors, with a positive and a negative
    # word bonus.
    for word_bonus in (1.0, -0.5):
        lm = _letters_lm(tmp_path, word_bonus)
        for seed in range(6):
            torch.manual_seed(seed)
            log_probs = torch.randn(40, 8).mul(1.0 + seed).log_softmax(dim=1)
            eager = _EagerLM(lm)
            expected = ctc_prefix_beam_search(log_probs, beam_size=6, lm=eager)
            counted = _EagerLM(lm)
            counted.bound = lm.bound
            assert ctc_prefix_beam_search(log_probs, beam_size=6, lm=counted) == expected
            assert counted.extends < eager.extends


class _Part:
    """An LM part that counts the live ones."""
    live = 0

    def __init__(self, part):
        self.part, self.score = part, part.score
        _Part.live += 1

    def __del__(self):
        _Part.live -= 1


class _CountingLM:
    """A word LM whose parts are :class:`_Part`; records the most parts alive at once."""

    def __init__(self, lm):
        self.lm, self.most_alive = lm, 0

    def start(self):
        return _Part(self.lm.start())

    def extend(self, part, prefix, token):
        self.most_alive = max(self.most_alive, _Part.live)
        return _Part(self.lm.extend(part.part, prefix, token))

    def bound(self, part):
        return self.lm.bound(part.part)

    def finish(self, part, prefix):
        return self.lm.finish(part.part, prefix)


def test_the_lm_parts_kept_do_not_grow_with_the_utterance(tmp_path):
    # A long utterance (issue 45): the search keeps the LM parts of its beam and of their extensions, not of every
    # prefix it ever scored; the n-best is the same.
    lm = _letters_lm(tmp_path, 1.0)
    torch.manual_seed(0)
    most_alive = []
    for frames in (100, 1000):
        log_probs = torch.randn(frames, 8).mul(3.0).log_softmax(dim=1)
        counting = _CountingLM(lm)
        nbest = ctc_prefix_beam_search(log_probs, beam_size=4, lm=counting)
        assert nbest == ctc_prefix_beam_search(log_probs, beam_size=4, lm=lm)
        most_alive.append(counting.most_alive)
    assert most_alive[1] <= 4 * (1 + 4) * 2 and most_alive[1] < 2 * most_alive[0]


def test_the_word_lm_bound_is_above_every_extension(tmp_path):
    # WordNgramLM.bound against the score of each one-token extension, along random prefixes of letters and word
    # starts (OOV words, the spelling LM and the penalty included).
    for word_bonus in (1.0, -0.5, 0.0):
        lm = _letters_lm(tmp_path, word_bonus)
        rng = torch.Generator().manual_seed(0)
        for _ in range(30):
            prefix, part = [], lm.start()
            for token in torch.randint(2, 8, (12,), generator=rng).tolist():
                ceiling = lm.bound(part)
                assert all(lm.extend(part, prefix, t).score <= ceiling + 1e-9 for t in range(2, 8))
                part, prefix = lm.extend(part, prefix, token), prefix + [token]


def _blank_heavy(frames: int, seed: int, vocab: int = 8) -> torch.Tensor:
    """Seeded (frames, vocab) CTC log-posteriors shaped like a trained model's: each non-blank unit (2 .. vocab - 1)
    peaks on one frame and blank on the 1-3 frames after it, over Gaussian noise, so that competitors stay close."""
    generator = torch.Generator().manual_seed(seed)
    targets = []
    while len(targets) < frames:
        targets.append(int(torch.randint(2, vocab, (1,), generator=generator)))
        targets += [0] * int(torch.randint(1, 4, (1,), generator=generator))
    logits = torch.randn(frames, vocab, generator=generator)
    logits[torch.arange(frames), torch.tensor(targets[:frames])] += 4.0
    return logits.log_softmax(dim=1)


def test_chunk_by_chunk_search_equals_the_whole_utterance_search(tmp_path):
    # Streaming (issue 46): the n-best after feeding the frames in chunks of 1, 4, 8, 16 or a random split is the
    # whole-utterance one, tokens and scores bit for bit, with and without the word LM (its OOV penalty and spelling
    # LM included); after every chunk the partial n-best is that of a search fed the frames so far at once.
    lm = _letters_lm(tmp_path, 1.0)
    log_probs = _blank_heavy(120, seed=0)
    generator = torch.Generator().manual_seed(1)
    cuts = sorted(torch.randperm(119, generator=generator)[:12].add(1).tolist())
    random_split = [b - a for a, b in zip([0] + cuts, cuts + [120])]
    for fused in (None, lm):
        whole = ctc_prefix_beam_search(log_probs, beam_size=6, lm=fused)
        assert len(whole) == 6 and len(whole[0].tokens) > 20
        for sizes in ([1] * 120, [4] * 30, [8] * 15, [16] * 7 + [8], random_split):
            search = CtcPrefixBeamSearch(6, fused)
            fed = 0
            for size in sizes:
                partial = search.feed(log_probs[fed: fed + size])
                fed += size
                if fed % 24 == 0 or size not in (1, 4):  # every chunk but of the smallest sizes, to keep it quick
                    assert partial == CtcPrefixBeamSearch(6, fused).feed(log_probs[:fed])
            assert search.finish() == whole
            if fused is None:
                assert partial == whole  # without an LM the last partial is the final n-best


def test_a_partial_n_best_holds_the_lm_score_of_the_complete_words_only(tmp_path):
    # A partial's lm_score is what its prefix competes on (WordNgramLM: the complete words, here with no OOV
    # penalty), not its open word's nor the end of sentence's, which finish adds; the partials rank on the sum.
    units = {0: "<blank>", 1: "<unk>", 2: "S", 3: "I", 4: "E", 5: "X", 6: "\u2581"}
    path = tmp_path / "lm.arpa"
    path.write_text(kneser_ney_arpa([["SIX"], ["SIX", "SIX"], ["SIX", "SIX", "SIX"]], order=2), encoding="utf-8")
    lm = WordNgramLM(str(path), units, 0.5, 0.0)
    # S I X ▁ S I X, one certain frame each: the best prefix has one complete word and an open one.
    log_probs = torch.nn.functional.one_hot(torch.tensor([2, 3, 5, 6, 2, 3, 5]), 7).float().clamp(min=1e-6).log()
    search = CtcPrefixBeamSearch(3, lm)
    partial = search.feed(log_probs)
    assert partial[0].tokens == [2, 3, 5, 6, 2, 3, 5]
    # KenLM's own sentence scores (log10, summed in float32): "<s> SIX" for the partial, "<s> SIX SIX </s>" for the
    # final.
    assert math.isclose(partial[0].lm_score, 0.5 * math.log(10) * lm.model.score("SIX", bos=True, eos=False),
                        rel_tol=1e-6)
    assert all(a.ctc_score + a.lm_score >= b.ctc_score + b.lm_score for a, b in zip(partial, partial[1:]))
    final = search.finish()[0]
    assert final.tokens == partial[0].tokens and final.ctc_score == partial[0].ctc_score
    assert math.isclose(final.lm_score, 0.5 * math.log(10) * lm.model.score("SIX SIX", bos=True, eos=True),
                        rel_tol=1e-6)
    assert search.feed(log_probs[:0]) == partial  # finish leaves the search as it was


def test_a_prefix_node_is_the_sequence_of_its_tokens():
    # Prefix against the tuple it stands for: length, items, slices, iteration, equality and hashing (two nodes
    # built apart with the same tokens are one dict key; a different token or length is another).
    tokens = (3, 1, 4, 1, 5, 9, 2, 6)
    a, b = Prefix(), Prefix()
    for token in tokens:
        a, b = Prefix(a, token), Prefix(b, token)
    assert len(a) == 8 and list(a) == list(tokens) and list(reversed(a)) == list(tokens[::-1])
    for i in range(-8, 8):
        assert a[i] == tokens[i]
    for s in (slice(3, None), slice(None, 2), slice(2, 6, 2), slice(None, None, -1), slice(6, 1, -3),
              slice(5, 2), slice(-3, None)):
        assert a[s] == tokens[s], s
    with pytest.raises(IndexError):
        a[8]
    assert a == b and a is not b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != Prefix(a.parent, 7) and a != a.parent and a.parent == b.parent and Prefix() == Prefix()


def test_the_streaming_search_refuses_what_it_cannot_search():
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        CtcPrefixBeamSearch(0)
    search = CtcPrefixBeamSearch(4)
    with pytest.raises(ValueError, match=r"must be \(T_chunk, V\)"):
        search.feed(torch.zeros(2, 3, 5))
    search.feed(torch.zeros(2, 5).log_softmax(dim=1))
    with pytest.raises(ValueError, match="V = 6, the previous chunks 5"):
        search.feed(torch.zeros(2, 6))


def test_the_tokens_read_per_frame_do_not_grow_with_the_utterance(tmp_path, monkeypatch):
    # The search's time per frame stays flat as hypotheses grow (benchmarks/bench_ctc_search.py times it): a prefix
    # is read only near its end, by the word LM (its open word) and by the partial n-best after each chunk (the
    # tokens after the previous chunk's), so the tokens read per frame are the same at 250 and 2000 frames. A
    # prefix read whole (an LM joining all its tokens, a tuple copy) would read ~8x more per frame at 2000.
    reads = [0]
    tail = Prefix._tail

    def counted_tail(self, count):
        reads[0] += count
        return tail(self, count)

    monkeypatch.setattr(Prefix, "_tail", counted_tail)
    lm = _letters_lm(tmp_path, 1.0)
    per_frame = []
    for frames in (250, 2000):
        log_probs = _blank_heavy(frames, seed=2)
        reads[0] = 0
        search = CtcPrefixBeamSearch(6, lm)
        for chunk in log_probs.split(16):
            search.feed(chunk)
        hyp = search.finish()[0]
        assert len(hyp.tokens) > frames / 4
        per_frame.append(reads[0] / frames)
    assert per_frame[0] > 1 and per_frame[1] < 1.5 * per_frame[0], per_frame
