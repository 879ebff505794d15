import torch

from toolkit.models.transformer.embedding import PositionalEncoding
from toolkit.models.transformer.subsampling import Conv2dSubsampling4
from toolkit.utils.mask import make_non_pad_mask

from ..conftest import assert_equal_up_to_rounding


def test_subsampled_lengths_follow_conv_arithmetic_on_real_speech(tiny_fsdd, tiny_lj):
    keys_fsdd = ["nicolas-6-00", "george-0-01", "lucas-5-01"]
    batches = [tiny_fsdd.batch(keys_fsdd), tiny_lj.batch(["LJ001-0002", "LJ001-0008"])]
    subsampling = Conv2dSubsampling4(80, 16, PositionalEncoding(16, 0.0)).eval()
    for feats, lengths in batches:
        mask = make_non_pad_mask(lengths).unsqueeze(1)
        out, pos_emb, out_mask = subsampling(feats, mask)
        time = feats.size(1)
        assert out.shape == (len(lengths), ((time - 1) // 2 - 1) // 2, 16)
        assert pos_emb.shape == (1, out.size(1), 16)
        assert out_mask.sum(dim=2).squeeze(1).tolist() == [
            ((n - 1) // 2 - 1) // 2 for n in lengths.tolist()]


def test_valid_outputs_depend_on_valid_frames_only(tiny_fsdd):
    feats, lengths = tiny_fsdd.batch(["george-0-01", "nicolas-6-00"])
    feats = feats.double()
    subsampling = Conv2dSubsampling4(80, 16, PositionalEncoding(16, 0.0)).double().eval()
    mask = make_non_pad_mask(lengths).unsqueeze(1)
    out, _, out_mask = subsampling(feats, mask)
    short = int(lengths[1])
    alone, _, _ = subsampling(feats[1:, :short], mask[1:, :, :short])
    valid = int(out_mask[1].sum())
    assert valid == alone.size(1)
    assert_equal_up_to_rounding(out[1, :valid], alone[0])
