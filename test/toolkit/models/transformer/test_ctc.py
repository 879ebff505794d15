import math

import pytest
import torch

from toolkit.models.transformer.ctc import CTC, min_ctc_frames
from toolkit.utils.common import IGNORE_ID


def test_loss_is_per_utterance_minus_log_likelihood():
    torch.manual_seed(0)
    ctc = CTC(odim=6, encoder_output_size=8)
    hs = torch.randn(2, 7, 8)
    hlens = torch.tensor([7, 5])
    ys = torch.tensor([[1, 2, 2], [3, 4, IGNORE_ID]])
    ys_lens = torch.tensor([3, 2])
    loss = ctc(hs, hlens, ys, ys_lens)
    log_probs = ctc.log_softmax(hs)
    per_utt = [
        torch.nn.functional.ctc_loss(log_probs[b, :hlens[b]].unsqueeze(1), ys[b:b + 1, :ys_lens[b]],
                                     hlens[b:b + 1], ys_lens[b:b + 1], reduction="sum")
        for b in range(2)]
    assert loss.shape == (2,)
    assert torch.allclose(loss, torch.stack(per_utt))


def test_single_frame_single_token_loss_is_minus_log_posterior():
    ctc = CTC(odim=3, encoder_output_size=4)
    hs = torch.randn(1, 1, 4)
    loss = ctc(hs, torch.tensor([1]), torch.tensor([[2]]), torch.tensor([1]))
    assert torch.allclose(loss, -ctc.log_softmax(hs)[0, 0, 2])


def test_min_frames_counts_a_blank_between_equal_neighbours():
    # "HELLO" as 1 2 3 3 4 needs 6 frames (H E L _ L O); "ABAB" has no equal neighbours; padding
    # (-1 -1) is never counted as a repeat.
    ys = torch.tensor([[1, 2, 3, 3, 4], [5, 6, 5, 6, IGNORE_ID], [7, 7, 7, IGNORE_ID, IGNORE_ID]])
    assert min_ctc_frames(ys, torch.tensor([5, 4, 3])).tolist() == [6, 4, 5]
    assert min_ctc_frames(torch.tensor([[9]]), torch.tensor([1])).tolist() == [1]


def test_an_utterance_without_alignment_is_infinite_not_zero():
    # 5 frames cannot hold 1 2 3 3 4 (6 needed), 6 frames can: the first is reported as inf (not hidden as 0).
    torch.manual_seed(0)
    ctc = CTC(odim=6, encoder_output_size=8)
    hs = torch.randn(2, 6, 8)
    ys = torch.tensor([[1, 2, 3, 3, 4]] * 2)
    loss = ctc(hs, torch.tensor([5, 6]), ys, torch.tensor([5, 5]))
    assert math.isinf(loss[0].item()) and math.isfinite(loss[1].item())


def test_upsampling_projects_each_encoder_frame_to_k_ctc_frames():
    # k = 2: CTC frame 2t + j is the j-th half of encoder frame t's projection; the loss aligns over 2 x hlens.
    torch.manual_seed(0)
    ctc = CTC(odim=5, encoder_output_size=8, upsample=2)
    hs = torch.randn(2, 3, 8)
    logits = ctc.ctc_lo(hs)  # (2, 3, 10)
    log_probs = ctc.log_softmax(hs)
    assert log_probs.shape == (2, 6, 5)
    assert torch.allclose(log_probs[:, 1::2], logits[..., 5:].log_softmax(-1))
    assert torch.allclose(log_probs[:, 0::2], logits[..., :5].log_softmax(-1))
    hlens, ys, ys_lens = torch.tensor([3, 2]), torch.tensor([[1, 2, 2, 3], [4, 4, IGNORE_ID, IGNORE_ID]]), \
        torch.tensor([4, 2])
    expected = [torch.nn.functional.ctc_loss(log_probs[b, :2 * hlens[b]].unsqueeze(1), ys[b:b + 1, :ys_lens[b]],
                                             2 * hlens[b:b + 1], ys_lens[b:b + 1], reduction="sum") for b in range(2)]
    assert torch.allclose(ctc(hs, hlens, ys, ys_lens), torch.stack(expected))
    # 1 2 2 3 needs 5 frames: 3 encoder frames hold it only upsampled
    assert math.isfinite(ctc(hs[:1], hlens[:1], ys[:1], ys_lens[:1]).item())
    assert math.isinf(CTC(odim=5, encoder_output_size=8)(hs[:1], hlens[:1], ys[:1], ys_lens[:1]).item())
    assert ctc.output_lengths(hlens).tolist() == [6, 4]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="upsample must be an integer >= 1"):
            CTC(odim=5, encoder_output_size=8, upsample=bad)
