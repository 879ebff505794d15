import math

import torch

from toolkit.models.transformer.decoder import TransformerDecoder
from toolkit.models.transformer.search import (attention_rescoring, ctc_greedy_search,
                                               ctc_prefix_beam_search)


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
    assert [hyp for hyp, _ in nbest] == [[1], [], [2]]
    for (_, score), expected in zip(nbest, [0.56, 0.25, 0.11]):
        assert math.isclose(score, math.log(expected), rel_tol=1e-6)


def test_prefix_beam_search_keeps_blank_separated_repeats():
    # a _ a with certainty -> "a a"; a a (no blank) collapses to "a".
    certain = torch.nn.functional.one_hot(torch.tensor([1, 0, 1]), 3).float().log()
    assert ctc_prefix_beam_search(certain, beam_size=2)[0] == ([1, 1], 0.0)
    merged = torch.nn.functional.one_hot(torch.tensor([1, 1]), 3).float().log()
    assert ctc_prefix_beam_search(merged, beam_size=2)[0] == ([1], 0.0)


def test_attention_rescoring_combines_decoder_ctc_and_length_scores():
    torch.manual_seed(0)
    decoder = TransformerDecoder(6, 16, attention_heads=2, linear_units=32, num_blocks=1).eval()
    memory = torch.randn(1, 5, 16)
    mask = torch.ones(1, 1, 5, dtype=torch.bool)
    short, long = [1], [1, 2, 3, 4]
    with torch.no_grad():
        # A large per-token bonus or penalty decides between a 1- and a 4-token hypothesis.
        assert attention_rescoring(decoder, memory, mask, [(short, 0.0), (long, 0.0)],
                                   5, 5, ctc_weight=0.5, length_penalty=100.0) == long
        assert attention_rescoring(decoder, memory, mask, [(short, 0.0), (long, 0.0)],
                                   5, 5, ctc_weight=0.5, length_penalty=-100.0) == short
        # A dominant CTC score wins only when it is weighted in.
        nbest = [(short, -1000.0), (long, 0.0)]
        assert attention_rescoring(decoder, memory, mask, nbest, 5, 5, ctc_weight=1.0) == long
        logits = decoder(memory.expand(2, -1, -1), mask.expand(2, -1, -1),
                         torch.tensor([[5, 1, 5, 5, 5], [5, 1, 2, 3, 4]]), torch.tensor([2, 5]))
        log_probs = logits.log_softmax(dim=-1)
        att_short = log_probs[0, 0, 1] + log_probs[0, 1, 5]
        att_long = sum(log_probs[1, i, t] for i, t in enumerate([1, 2, 3, 4, 5]))
        expected = short if att_short > att_long else long
        assert attention_rescoring(decoder, memory, mask, nbest, 5, 5, ctc_weight=0.0) == expected
