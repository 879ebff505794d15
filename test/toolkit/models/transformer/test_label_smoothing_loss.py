import math

import pytest
import torch

from toolkit.models.transformer.label_smoothing_loss import LabelSmoothingLoss
from toolkit.utils.common import IGNORE_ID


def _logits_and_target():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[1, 4, 2], [3, IGNORE_ID, IGNORE_ID]])
    return logits, target


def test_zero_smoothing_equals_cross_entropy():
    logits, target = _logits_and_target()
    ce_sum = torch.nn.functional.cross_entropy(logits.view(-1, 5), target.view(-1),
                                               ignore_index=IGNORE_ID, reduction="sum")
    by_batch = LabelSmoothingLoss(5, 0.0)(logits, target)
    by_token = LabelSmoothingLoss(5, 0.0, normalize_length=True)(logits, target)
    assert torch.allclose(by_batch, ce_sum / 2)
    assert torch.allclose(by_token, ce_sum / 4)


def test_smoothed_loss_matches_kl_formula():
    # One token, V = 3, smoothing 0.2: q = [0.1, 0.8, 0.1] around target 1, p = uniform.
    loss = LabelSmoothingLoss(3, 0.2)(torch.zeros(1, 1, 3), torch.tensor([[1]]))
    expected = sum(q * (math.log(q) - math.log(1 / 3)) for q in (0.1, 0.8, 0.1))
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)


def test_invalid_smoothing_raises():
    with pytest.raises(ValueError):
        LabelSmoothingLoss(5, 1.0)


def test_a_row_that_is_all_padding_is_not_an_utterance():
    # An utterance the model leaves out of the loss has every target ignored: the per-utterance normaliser must not
    # count it, or the others' loss would shrink by B_kept / B.
    logits, target = _logits_and_target()
    with_empty = torch.cat([logits, torch.randn(1, 3, 5)]), torch.cat([target, torch.full((1, 3), IGNORE_ID)])
    for normalize_length in (False, True):
        loss = LabelSmoothingLoss(5, 0.1, normalize_length=normalize_length)
        assert torch.allclose(loss(*with_empty), loss(logits, target)), normalize_length
    assert LabelSmoothingLoss(5, 0.1)(logits[:1], torch.full((1, 3), IGNORE_ID)).item() == 0.0
