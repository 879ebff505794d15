import math

import pytest
import torch

from toolkit.models.transformer.dropout import Dropout


def test_training_drops_each_element_with_probability_p_and_scales_the_rest():
    torch.manual_seed(0)
    p, n = 0.1, 2_000_000
    x = torch.full((n,), 2.0)
    y = Dropout(p).train()(x)
    kept = y != 0
    # kept elements are scaled by 1 / (1 - p); the kept count is binomial(n, 1 - p): 6 standard deviations
    assert torch.equal(y[kept], torch.full((int(kept.sum()),), 2.0 / (1 - p)))
    assert abs(int(kept.sum()) - n * (1 - p)) < 6 * math.sqrt(n * p * (1 - p))
    # elements are dropped independently: neighbours are kept together as often as independence says
    pairs = float((kept[:-1] & kept[1:]).float().mean())
    assert abs(pairs - (1 - p) ** 2) < 6 * math.sqrt((1 - p) ** 2 / (n - 1))


@pytest.mark.parametrize("shape", [(3, 1, 5), (1,), (0, 4)])  # an odd number of elements; none
def test_odd_and_empty_tensors_keep_their_shape(shape):
    x = torch.ones(shape)
    y = Dropout(0.5).train()(x)
    assert y.shape == x.shape and bool(((y == 0) | (y == 2.0)).all())


def test_gradient_is_the_mask_times_the_scale_and_masks_repeat_under_a_seed():
    x = torch.randn(4, 50, 16, requires_grad=True)
    dropout = Dropout(0.3).train()
    torch.manual_seed(5)
    y = dropout(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(grad, (y != 0).float() / 0.7)
    torch.manual_seed(5)
    assert torch.equal(dropout(x), y)


def test_eval_and_zero_probability_are_the_identity_and_one_drops_everything():
    x = torch.randn(3, 7)
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_refuses_a_probability_outside_0_1_and_scripts():
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
    scripted = torch.jit.script(Dropout(0.2))
    x = torch.ones(100_000)
    assert torch.equal(scripted.eval()(x), x)
    kept = scripted.train()(x) != 0  # TorchScript runs torch's own dropout: the same distribution
    assert abs(float(kept.float().mean()) - 0.8) < 6 * math.sqrt(0.8 * 0.2 / x.numel())
