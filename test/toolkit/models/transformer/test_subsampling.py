import pytest
import torch

from toolkit.models.transformer.embedding import PositionalEncoding
from toolkit.models.transformer.subsampling import Conv2dSubsampling
from toolkit.utils.mask import make_non_pad_mask

from ..conftest import assert_equal_up_to_rounding


def _frames(length: int, rate: int) -> int:
    """What 2 (rate 4) or 3 (rate 8) unpadded 3x3 stride-2 convolutions leave of ``length`` frames."""
    for _ in range({4: 2, 8: 3}[rate]):
        length = max((length - 3) // 2 + 1, 0)
    return length


@pytest.mark.parametrize("rate", [4, 8])
def test_subsampled_lengths_follow_conv_arithmetic_on_real_speech(tiny_fsdd, tiny_lj, rate):
    keys_fsdd = ["nicolas-6-00", "george-0-01", "lucas-5-01"]
    batches = [tiny_fsdd.batch(keys_fsdd), tiny_lj.batch(["LJ001-0002", "LJ001-0008"])]
    subsampling = Conv2dSubsampling(80, 16, PositionalEncoding(16, 0.0), rate=rate).eval()
    for feats, lengths in batches:
        mask = make_non_pad_mask(lengths).unsqueeze(1)
        out, pos_emb, out_mask = subsampling(feats, mask)
        time = feats.size(1)
        assert out.shape == (len(lengths), _frames(time, rate), 16)
        assert pos_emb.shape == (1, out.size(1), 16)
        assert out_mask.sum(dim=2).squeeze(1).tolist() == [_frames(n, rate) for n in lengths.tolist()]
        assert subsampling.output_lengths(lengths).tolist() == [_frames(n, rate) for n in lengths.tolist()]


@pytest.mark.parametrize("rate, receptive_field", [(4, 7), (8, 15)])
def test_clips_under_the_receptive_field_give_one_invalid_frame(rate, receptive_field):
    subsampling = Conv2dSubsampling(80, 8, PositionalEncoding(8, 0.0), rate=rate).eval()
    lengths = torch.tensor([receptive_field - 1, 3])
    out, _, out_mask = subsampling(torch.randn(2, receptive_field - 1, 80), make_non_pad_mask(lengths).unsqueeze(1))
    assert out.shape == (2, 1, 8) and not bool(out_mask.any())
    assert subsampling.output_lengths(torch.tensor([0, 1, receptive_field - 1, receptive_field])).tolist() == [
        0, 0, 0, 1]


def test_an_unknown_rate_is_refused():
    with pytest.raises(ValueError, match="rate must be one of \\[4, 8\\], got 6"):
        Conv2dSubsampling(80, 8, PositionalEncoding(8, 0.0), rate=6)


@pytest.mark.parametrize("rate", [4, 8])
def test_valid_outputs_depend_on_valid_frames_only(tiny_fsdd, rate):
    feats, lengths = tiny_fsdd.batch(["george-0-01", "nicolas-6-00"])
    feats = feats.double()
    subsampling = Conv2dSubsampling(80, 16, PositionalEncoding(16, 0.0), rate=rate).double().eval()
    mask = make_non_pad_mask(lengths).unsqueeze(1)
    out, _, out_mask = subsampling(feats, mask)
    short = int(lengths[1])
    alone, _, _ = subsampling(feats[1:, :short], mask[1:, :, :short])
    valid = int(out_mask[1].sum())
    assert valid == alone.size(1)
    assert_equal_up_to_rounding(out[1, :valid], alone[0])


def _reference_convolutions(conv, feats):
    """The convolutions as plain conv2d + ReLU on contiguous tensors: what the front end's layers must equal."""
    x = feats.unsqueeze(1)
    for layer in conv:
        x = torch.relu(torch.nn.functional.conv2d(x, layer.weight, layer.bias, 2))
    return x


@pytest.mark.parametrize("rate", [4, 8])
def test_front_end_convolutions_and_their_gradients_equal_plain_conv2d(tiny_fsdd, tiny_lj, rate):
    """The patch product, channels-last layout, in-place ReLUs and the per-tap weight gradient (the CPU training path)
    compute the same function and the same gradients as two nn.functional.conv2d + ReLU, in float64; and the
    TorchScript path (plain conv2d) gives the same output."""
    subsampling = Conv2dSubsampling(80, 8, PositionalEncoding(8, 0.0), channels=6, rate=rate).double().train()
    conv = subsampling.conv
    for feats, _ in (tiny_fsdd.batch(["george-0-01", "nicolas-6-00"]), tiny_lj.batch(["LJ001-0002"])):
        feats = feats.double()
        out = conv(feats)
        assert out.is_contiguous(memory_format=torch.channels_last)
        ref = _reference_convolutions(conv, feats)
        assert_equal_up_to_rounding(out, ref)
        upstream = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        params = list(conv.parameters())
        assert len(params) == 2 * {4: 2, 8: 3}[rate]
        grads = torch.autograd.grad(out, params, upstream)
        ref_grads = torch.autograd.grad(ref, params, upstream)
        for grad, ref_grad in zip(grads, ref_grads):
            assert grad.shape == ref_grad.shape and bool(ref_grad.abs().max() > 0)
            # gradients sum over every output position: rounding relative to their scale
            assert_equal_up_to_rounding(grad / ref_grad.abs().max(), ref_grad / ref_grad.abs().max())
        scripted = torch.jit.script(conv)
        assert_equal_up_to_rounding(scripted(feats), ref)


def test_front_end_under_bf16_autocast_matches_plain_conv2d_and_its_gradients(tiny_fsdd):
    """bf16 training on CPU (``train_conf.dtype bf16``): the custom weight gradient runs in the dtype autocast gave
    the convolution. It failed on a CPU without native bf16 (AMD EPYC, AVX2: "expected scalar type BFloat16 but
    found Float", the saved float32 weight against bf16 activations); each gradient is float32 like its parameter
    and within bf16 rounding of autocast's plain conv2d."""
    torch.manual_seed(0)
    conv = Conv2dSubsampling(80, 8, PositionalEncoding(8, 0.0), channels=6).train().conv
    feats, _ = tiny_fsdd.batch(["george-0-01", "nicolas-6-00"])
    params = list(conv.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = conv(feats), _reference_convolutions(conv, feats)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert float((out - ref).abs().max()) <= 0.02 * float(ref.abs().max())
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
    grads = torch.autograd.grad(out.float(), params, upstream)
    ref_grads = torch.autograd.grad(ref.float(), params, upstream)
    for grad, ref_grad in zip(grads, ref_grads):
        assert grad.dtype == torch.float32 and grad.shape == ref_grad.shape
        # bf16 has 8 bits of mantissa: sums over thousands of positions, rounded in another order, agree to ~1 %
        assert float((grad - ref_grad).abs().max()) <= 0.02 * float(ref_grad.abs().max())


def test_front_end_parameters_keep_the_default_layout_and_conv2d_initialisation():
    """DDP buckets and DeepSpeed flatten the parameters: they stay contiguous (the channels-last copies live in the
    graph), and a gradient step leaves them so."""
    torch.manual_seed(3)
    subsampling = Conv2dSubsampling(80, 8, PositionalEncoding(8, 0.0), channels=6)
    conv = subsampling.conv
    assert conv[0].weight.shape == (6, 1, 3, 3) and conv[1].weight.shape == (6, 6, 3, 3)
    torch.manual_seed(3)
    plain = torch.nn.Conv2d(1, 6, 3, 2)  # the same draws as the constructor's first convolution
    assert torch.equal(conv[0].weight, plain.weight) and torch.equal(conv[0].bias, plain.bias)
    feats = torch.randn(2, 40, 80)
    out, _, _ = subsampling(feats, torch.ones(2, 1, 40, dtype=torch.bool))
    out.sum().backward()
    for param in conv.parameters():
        assert param.is_contiguous() and param.grad.is_contiguous()
