import pytest
import torch
from torch import nn

from toolkit.models.transformer.convolution import ConvolutionModule

from ..conftest import assert_equal_up_to_rounding


def _paper_layout(module, x, mask_pad):
    """The module as Gulati et al. draw it, on (B, D, T): kernel-1 Conv1d, GLU over channels, depthwise Conv1d,
    norm, Swish, kernel-1 Conv1d, with the module's own parameters."""
    conv1d = nn.functional.conv1d
    y = conv1d(x.transpose(1, 2), module.pointwise_conv1.weight.unsqueeze(-1), module.pointwise_conv1.bias)
    y = nn.functional.glu(y, dim=1).masked_fill(~mask_pad, 0.0)
    y = conv1d(y, module.depthwise_conv.weight.squeeze(2), module.depthwise_conv.bias,
               padding=module.depthwise_conv.padding[1], groups=y.size(1))
    norm = module.norm
    if isinstance(norm, nn.LayerNorm):
        y = norm(y.transpose(1, 2)).transpose(1, 2)
    else:  # batch statistics in training, running ones in eval: BatchNorm1d's rule
        y = nn.functional.batch_norm(y, norm.running_mean.clone(), norm.running_var.clone(), norm.weight,
                                     norm.bias, norm.training, 0.0, norm.eps)
    y = conv1d(module.activation(y), module.pointwise_conv2.weight.unsqueeze(-1), module.pointwise_conv2.bias)
    return y.transpose(1, 2)


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm"])
@pytest.mark.parametrize("training", [True, False])
def test_the_module_computes_the_papers_layout_and_gradients(norm, training):
    torch.manual_seed(0)
    module = ConvolutionModule(12, 7, nn.SiLU(), norm).double().train(training)
    if norm == "batch_norm":  # non-trivial running statistics for eval mode
        module.norm.running_mean.uniform_(-1, 1)
        module.norm.running_var.uniform_(0.5, 2)
    x = torch.randn(3, 20, 12, dtype=torch.float64, requires_grad=True)
    mask_pad = (torch.arange(20) < torch.tensor([20, 13, 5]).unsqueeze(1)).unsqueeze(1)
    reference = _paper_layout(module, x, mask_pad)
    out = module(x, mask_pad)
    assert_equal_up_to_rounding(out, reference)
    params = [x, *module.parameters()]
    for grad, ref_grad in zip(torch.autograd.grad(out.sum(), params), torch.autograd.grad(reference.sum(), params)):
        assert_equal_up_to_rounding(grad, ref_grad)
