"""Global cepstral mean and variance normalisation (CMVN) of fbank features."""
import json

import torch
from torch import nn


def load_global_cmvn(cmvn_file: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read global CMVN statistics and turn them into a mean and an inverse standard deviation.

    The file is JSON ``{"mean_stat": [D sums], "var_stat": [D sums of squares], "frame_num": N}``
    accumulated over the training set.

    Returns:
        (mean, istd): float32 (D,) each.

    Raises:
        OSError: the file cannot be read. KeyError / ValueError: a field is missing, the two stat
        vectors differ in length, or ``frame_num`` is not positive.
    """
    with open(cmvn_file, encoding="utf-8") as f:
        stats = json.load(f)
    mean_stat = torch.tensor(stats["mean_stat"], dtype=torch.float64)
    var_stat = torch.tensor(stats["var_stat"], dtype=torch.float64)
    frame_num = float(stats["frame_num"])
    if mean_stat.shape != var_stat.shape or frame_num <= 0:
        raise ValueError(f"inconsistent CMVN stats in {cmvn_file}")
    mean = mean_stat / frame_num
    # E[x^2] - E[x]^2 can dip below zero by rounding on constant bins; the floor keeps istd finite.
    variance = (var_stat / frame_num - mean * mean).clamp(min=1.0e-20)
    return mean.float(), variance.rsqrt().float()


class GlobalCMVN(nn.Module):
    """Normalise features as ``(x - mean) * istd`` with statistics fixed at construction.

    ``mean`` and ``istd`` are buffers, so checkpoints and TorchScript exports carry them and a
    decoder never needs the original stats file.

    Args:
        mean: float32 (D,) per-bin mean.
        istd: float32 (D,) per-bin inverse standard deviation.
        norm_var: also scale by ``istd`` (False: mean subtraction only).

    Raises:
        ValueError: ``mean`` and ``istd`` differ in shape.
    """

    def __init__(self, mean: torch.Tensor, istd: torch.Tensor, norm_var: bool = True):
        super().__init__()
        if mean.shape != istd.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and istd {tuple(istd.shape)} differ")
        self.norm_var = norm_var
        self.register_buffer("mean", mean.float())
        self.register_buffer("istd", istd.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 (B, T, D) -> float32 (B, T, D) normalised features."""
        x = x - self.mean
        if self.norm_var:
            x = x * self.istd
        return x
