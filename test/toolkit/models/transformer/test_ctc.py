import torch

from toolkit.models.transformer.ctc import CTC
from toolkit.utils.common import IGNORE_ID


def test_loss_is_sum_over_utterances_divided_by_batch():
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
    assert torch.allclose(loss, (per_utt[0] + per_utt[1]) / 2)


def test_single_frame_single_token_loss_is_minus_log_posterior():
    ctc = CTC(odim=3, encoder_output_size=4)
    hs = torch.randn(1, 1, 4)
    loss = ctc(hs, torch.tensor([1]), torch.tensor([[2]]), torch.tensor([1]))
    assert torch.allclose(loss, -ctc.log_softmax(hs)[0, 0, 2])
    assert ctc.argmax(hs).shape == (1, 1)
