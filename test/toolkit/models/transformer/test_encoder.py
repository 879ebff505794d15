import pytest
import torch

from toolkit.models.transformer.ctc import CTC
from toolkit.models.transformer.encoder import ConformerEncoder, TransformerEncoder

from ..conftest import assert_equal_up_to_rounding

KEYS = ["lucas-5-01", "george-0-01", "nicolas-6-00"]
SMALL = dict(output_size=32, attention_heads=4, linear_units=64, num_blocks=2)


def _self_conditioned(encoder):
    encoder.set_self_conditioning(CTC(10, encoder.output_size(), upsample=2))
    return encoder


def _encoders():
    torch.manual_seed(0)
    return [TransformerEncoder(80, **SMALL),
            ConformerEncoder(80, cnn_module_kernel=7, **SMALL),
            ConformerEncoder(80, cnn_module_kernel=7, cnn_module_norm="layer_norm", **SMALL),
            ConformerEncoder(80, cnn_module_kernel=7, input_layer="conv2d8", **SMALL),
            ConformerEncoder(80, cnn_module_kernel=7, time_reduce_idx=1, time_recover_idx=2, **SMALL),
            TransformerEncoder(80, time_reduce_idx=1, time_recover_idx=2, **SMALL),
            _self_conditioned(ConformerEncoder(80, cnn_module_kernel=7, interctc_layer_idx=[1], **SMALL))]


CONV_LAYERS = [2, 2, 2, 3, 2, 2, 2]  # 3x3 stride-2 convolutions of each encoder's front end
ENCODERS = range(len(CONV_LAYERS))


def _subsampled(length: int, layers: int) -> int:
    for _ in range(layers):
        length = (length - 1) // 2
    return length


def _trained_batch_norm(encoder, feats, lengths):
    """Give BatchNorm non-trivial running statistics so eval mode is a real test."""
    encoder.train()
    with torch.no_grad():
        encoder(feats, lengths)
    return encoder.eval()


@pytest.mark.parametrize("index", ENCODERS)
def test_output_length_and_mask_match_subsampling_formula(tiny_fsdd, index):
    feats, lengths = tiny_fsdd.batch(KEYS)
    encoder = _encoders()[index].eval()
    out, mask = encoder(feats, lengths)
    layers = CONV_LAYERS[index]
    assert out.shape == (3, _subsampled(feats.size(1), layers), 32)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, out.size(1))
    expected = [_subsampled(n, layers) for n in lengths.tolist()]
    assert mask.sum(dim=2).squeeze(1).tolist() == expected == encoder.output_lengths(lengths).tolist()


@pytest.mark.parametrize("index", ENCODERS)
def test_padded_batch_matches_each_utterance_alone(tiny_fsdd, index):
    feats, lengths = tiny_fsdd.batch(KEYS)
    assert len(set(lengths.tolist())) == 3
    feats = feats.double()
    encoder = _trained_batch_norm(_encoders()[index].double(), feats, lengths)
    with torch.no_grad():
        out, mask = encoder(feats, lengths)
        for b, length in enumerate(lengths.tolist()):
            alone, alone_mask = encoder(feats[b:b + 1, :length], lengths[b:b + 1])
            valid = int(mask[b].sum())
            assert alone.size(1) == valid and bool(alone_mask.all())
            assert_equal_up_to_rounding(out[b, :valid], alone[0])


@pytest.mark.parametrize("index", ENCODERS)
def test_torchscript_encoder_matches_eager(tiny_fsdd, index):
    feats, lengths = tiny_fsdd.batch(KEYS)
    feats = feats.double()
    encoder = _trained_batch_norm(_encoders()[index].double(), feats, lengths)
    scripted = torch.jit.script(encoder)
    with torch.no_grad():
        out, mask = encoder(feats, lengths)
        out_script, mask_script = scripted(feats, lengths)
    assert torch.equal(mask, mask_script)
    assert_equal_up_to_rounding(out, out_script)


def test_invalid_names_raise_value_error_listing_choices():
    with pytest.raises(ValueError, match="rel_pos"):
        ConformerEncoder(80, pos_enc_layer_type="sinusoid", **SMALL)
    with pytest.raises(ValueError, match="rel_selfattn goes with"):
        TransformerEncoder(80, selfattention_layer_type="rel_selfattn", **SMALL)
    with pytest.raises(ValueError, match="odd"):
        ConformerEncoder(80, cnn_module_kernel=8, **SMALL)
    with pytest.raises(ValueError, match=r"unknown input_layer 'conv2d6'; valid: \['conv2d', 'conv2d8'\]"):
        ConformerEncoder(80, input_layer="conv2d6", **SMALL)


def test_time_reduction_runs_the_middle_layers_on_half_the_frames(tiny_fsdd):
    feats, lengths = tiny_fsdd.batch(KEYS)
    torch.manual_seed(0)
    encoder = ConformerEncoder(80, cnn_module_kernel=7, **dict(SMALL, num_blocks=4), time_reduce_idx=1,
                               time_recover_idx=3, interctc_layer_idx=[1, 3]).eval()
    seen = []
    for layer in encoder.encoders:
        layer.register_forward_pre_hook(lambda module, args: seen.append((args[0].size(1), int(args[1].sum()))))
    with torch.no_grad():
        out, mask, intermediate = encoder.forward_layers(feats[:1, :lengths[0]], lengths[:1], [1, 3])
    frames = _subsampled(int(lengths[0]), 2)
    half = (frames + 1) // 2
    assert seen == [(frames, frames), (half, half), (half, half), (frames, frames)]
    assert out.shape == (1, frames, 32) and int(mask.sum()) == frames
    assert [t.shape for t in intermediate] == [out.shape, out.shape]
    # The U-Net is no identity: without its layers' outputs the result differs.
    plain = ConformerEncoder(80, cnn_module_kernel=7, **dict(SMALL, num_blocks=4)).eval()
    plain.load_state_dict(encoder.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(plain(feats[:1, :lengths[0]], lengths[:1])[0], out)


def test_self_conditioning_needs_an_intermediate_layer():
    with pytest.raises(ValueError, match="self-conditioned CTC needs encoder_conf.interctc_layer_idx"):
        ConformerEncoder(80, **SMALL).set_self_conditioning(CTC(10, 32))


@pytest.mark.parametrize("reduce, recover, interctc, message", [
    (0, 2, [], r"need 1 <= time_reduce_idx < time_recover_idx <= num_blocks = 3, or both 0"),
    (2, 2, [], r"time_reduce_idx 2 and time_recover_idx 2"),
    (1, 4, [], r"time_recover_idx 4: need"),
    (1, 3, [2], r"interctc_layer_idx \[2\] between time_reduce_idx 1 and time_recover_idx 3"),
])
def test_time_reduction_layers_are_checked(reduce, recover, interctc, message):
    with pytest.raises(ValueError, match=message):
        ConformerEncoder(80, **dict(SMALL, num_blocks=3), time_reduce_idx=reduce, time_recover_idx=recover,
                         interctc_layer_idx=interctc)
