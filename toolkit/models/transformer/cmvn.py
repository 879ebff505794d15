"""Global cepstral mean and variance normalisation (CMVN) of fbank features."""
import json

import torch
from torch import nn

from toolkit.utils.config_parsing import ConfigError


def load_global_cmvn(cmvn_file: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read global CMVN statistics and turn them into a mean and an inverse standard deviation.

    The file is JSON ``{"mean_stat": [D sums], "var_stat": [D sums of squares], "frame_num": N}``
    accumulated over the training set.

    Returns:
        (mean, istd): float32 (D,) each.

    Raises:
        ConfigError: the file is missing or unreadable (the message says how to make it or turn CMVN off), is not
            JSON, lacks a field, the two stat vectors differ in length, ``frame_num`` is not positive, or a bin's
            mean or inverse standard deviation is not finite.
    """
    try:
        with open(cmvn_file, encoding="utf-8") as f:
            stats = json.load(f)
    except OSError as e:
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: {e.strerror}; compute it with "
                          "tools/compute_cmvn_stats.py (the recipe's stage 1), or set 'cmvn: null'") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: not JSON ({e}); rewrite it with "
                          "tools/compute_cmvn_stats.py") from e
    missing = [key for key in ("mean_stat", "var_stat", "frame_num") if key not in stats]
    if missing:
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: no {missing}; rewrite it with tools/compute_cmvn_stats.py")
    mean_stat = torch.tensor(stats["mean_stat"], dtype=torch.float64)
    var_stat = torch.tensor(stats["var_stat"], dtype=torch.float64)
    frame_num = float(stats["frame_num"])
    if mean_stat.shape != var_stat.shape or not frame_num > 0:
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: inconsistent stats (mean_stat {tuple(mean_stat.shape)}, "
                          f"var_stat {tuple(var_stat.shape)}, frame_num {frame_num}); rewrite it with "
                          "tools/compute_cmvn_stats.py")
    mean = mean_stat / frame_num
    # E[x^2] - E[x]^2 can dip below zero by rounding on constant bins; the floor keeps istd finite.
    istd = (var_stat / frame_num - mean * mean).clamp(min=1.0e-20).rsqrt()
    bad = (~(torch.isfinite(mean) & torch.isfinite(istd))).nonzero().flatten().tolist()
    if bad:  # stats summed over audio holding NaN samples: every feature, loss and update would be NaN
        raise ConfigError(f"cmvn_conf.cmvn_file {cmvn_file}: NaN or infinite statistics in {len(bad)} of "
                          f"{mean.numel()} bins (first {bad[:5]}); recompute it with tools/compute_cmvn_stats.py, "
                          "which skips audio holding NaN or infinite samples")
    return mean.float(), istd.float()


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
