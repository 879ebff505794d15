import torch

from toolkit.models.transformer.attention import (MultiHeadedAttention,
                                                  RelPositionMultiHeadedAttention, rel_shift)
from toolkit.models.transformer.embedding import RelPositionalEncoding


def test_rel_shift_picks_the_column_of_distance_i_minus_j():
    time = 4
    # Column k of the input stands for distance time - 1 - k; fill it with that distance.
    distances = torch.arange(time - 1, -time, -1).float()
    x = distances.expand(2, 3, time, 2 * time - 1).clone()
    shifted = rel_shift(x)
    i = torch.arange(time).unsqueeze(1)
    j = torch.arange(time).unsqueeze(0)
    assert shifted.shape == (2, 3, time, time)
    assert torch.equal(shifted[1, 2], (i - j).float())


def test_rel_pos_encoding_center_is_distance_zero():
    pos_enc = RelPositionalEncoding(8, dropout_rate=0.0)
    x, pos_emb = pos_enc(torch.ones(1, 5, 8))
    assert pos_emb.shape == (1, 9, 8)
    # Distance 0 sits in the middle: sin(0) = 0 on even dims, cos(0) = 1 on odd dims.
    assert torch.equal(pos_emb[0, 4], torch.tensor([0.0, 1.0] * 4))
    assert torch.allclose(x, torch.full((1, 5, 8), 8 ** 0.5))


def test_masked_keys_get_no_weight():
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8)
    _, pos_emb = RelPositionalEncoding(8, 0.0)(x)
    mask = torch.tensor([[[True, True, True, False, False]]])
    changed = x.clone()
    changed[:, 3:] = 100.0
    for attention in (MultiHeadedAttention(2, 8, 0.0), RelPositionMultiHeadedAttention(2, 8, 0.0)):
        out = attention(x, x, x, mask, pos_emb)
        out_changed = attention(changed, changed, changed, mask, pos_emb)
        assert torch.equal(out[:, :3], out_changed[:, :3])  # masked keys weigh exactly 0: bit for bit
        assert not torch.allclose(out[:, 3:], out_changed[:, 3:])
