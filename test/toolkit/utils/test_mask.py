import torch

from toolkit.utils.mask import make_non_pad_mask, make_pad_mask, subsequent_mask


def test_make_pad_mask_marks_positions_at_or_after_length():
    mask = make_pad_mask(torch.tensor([3, 1, 0]))
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[False, False, False], [False, True, True], [True, True, True]]


def test_make_pad_mask_max_len_widens_the_mask():
    assert make_pad_mask(torch.tensor([2]), max_len=4).tolist() == [[False, False, True, True]]


def test_make_non_pad_mask_is_the_complement():
    lengths = torch.tensor([4, 2])
    assert torch.equal(make_non_pad_mask(lengths, 5), ~make_pad_mask(lengths, 5))
    assert make_non_pad_mask(lengths).sum(dim=1).tolist() == [4, 2]


def test_subsequent_mask_is_lower_triangular():
    mask = subsequent_mask(3)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
