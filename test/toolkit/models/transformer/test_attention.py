import torch

from toolkit.models.transformer.attention import (MultiHeadedAttention,
                                                  RelPositionMultiHeadedAttention, rel_shift)
from toolkit.models.transformer.embedding import RelPositionalEncoding

from ..conftest import assert_equal_up_to_rounding


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


def test_rel_shift_of_one_frame_and_of_a_view_with_an_offset():
    # T = 1: the single column is distance 0; a contiguous view that starts inside a larger tensor is shifted from
    # its own first element
    one = torch.randn(2, 3, 1, 1)
    assert torch.equal(rel_shift(one), one)
    time = 5
    big = torch.randn(3, 2, 3, time, 2 * time - 1)
    expected = torch.stack([torch.stack([big[1, b, h, i, time - 1 - i:2 * time - 1 - i] for i in range(time)])
                            for b in range(2) for h in range(3)]).view(2, 3, time, time)
    assert big[1].storage_offset() > 0 and torch.equal(rel_shift(big[1]), expected)


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


def _textbook(attention, query, key, value, mask, pos_emb):
    """The attention written out as its papers state it: scores, -inf at masked keys, softmax (a row with no valid
    key: zero weights), weighted values, output projection; Transformer-XL's position term for the relative one."""
    h, d_k = attention.h, attention.d_k
    q = attention.linear_q(query).view(query.size(0), -1, h, d_k)
    k = attention.split_heads(attention.linear_k(key))
    v = attention.split_heads(attention.linear_v(value))
    if isinstance(attention, RelPositionMultiHeadedAttention):
        p = attention.split_heads(attention.linear_pos(pos_emb))
        scores = ((q + attention.pos_bias_u).transpose(1, 2) @ k.transpose(-2, -1)
                  + rel_shift((q + attention.pos_bias_v).transpose(1, 2) @ p.transpose(-2, -1)))
    else:
        scores = q.transpose(1, 2) @ k.transpose(-2, -1)
    scores = (scores / d_k ** 0.5).masked_fill(~mask.unsqueeze(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    x = (weights @ v).transpose(1, 2).reshape(query.size(0), -1, h * d_k)
    return attention.linear_out(x)


def test_attention_equals_the_textbook_formula_with_its_gradients_and_empty_rows_give_zeros():
    """scaled_dot_product_attention (a fused CPU kernel for boolean masks, the position term as an additive bias for
    the relative one) computes the papers' formula, in float64; a sequence with no valid key gives the output
    projection's bias, never NaN, and no NaN gradient."""
    torch.manual_seed(0)
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    _, pos_emb = RelPositionalEncoding(8, 0.0)(x)
    lengths = torch.tensor([6, 2, 0])
    mask = (torch.arange(6) < lengths.unsqueeze(1)).unsqueeze(1)  # (B, 1, T)
    causal = mask & torch.tril(torch.ones(6, 6, dtype=torch.bool))  # (B, T, T)
    for attention, masks in ((MultiHeadedAttention(2, 8, 0.0), (mask, causal)),
                             (RelPositionMultiHeadedAttention(2, 8, 0.0), (mask, causal))):
        attention = attention.double()
        for m in masks:
            inputs = x.clone().requires_grad_()
            out = attention(inputs, inputs, inputs, m, pos_emb.double())
            ref_inputs = x.clone().requires_grad_()
            ref = _textbook(attention, ref_inputs, ref_inputs, ref_inputs, m, pos_emb.double())
            assert_equal_up_to_rounding(out, ref)
            assert torch.equal(out[2], attention.linear_out.bias.expand(6, 8))
            (grad,) = torch.autograd.grad(out.sum(), inputs)
            (ref_grad,) = torch.autograd.grad(ref.sum(), ref_inputs)
            assert not grad.isnan().any()
            assert_equal_up_to_rounding(grad, ref_grad)


def test_rel_shift_by_padding_equals_the_strided_rel_shift():
    # The export form (toolkit.export) and the training form: the same values for queries that are the last of the keys.
    from toolkit.models.transformer.attention import rel_shift_by_padding

    torch.manual_seed(0)
    for queries, keys in ((1, 1), (4, 4), (3, 9), (16, 80)):
        x = torch.randn(2, 3, queries, queries + keys - 1)
        assert torch.equal(rel_shift_by_padding(x), rel_shift(x))


def test_attention_for_export_gives_the_same_output():
    torch.manual_seed(0)
    attention = RelPositionMultiHeadedAttention(4, 16, 0.0).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = torch.ones(2, 1, 7, dtype=torch.bool)
    mask[1, :, 5:] = False
    pos_emb = RelPositionalEncoding(16, 0.0).positions(7).double()
    expected = attention(x, x, x, mask, pos_emb)
    attention.for_export = True
    assert_equal_up_to_rounding(attention(x, x, x, mask, pos_emb), expected)
