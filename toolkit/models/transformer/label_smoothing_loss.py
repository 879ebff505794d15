"""Label-smoothed cross entropy (Szegedy et al., 2016, arXiv:1512.00567, section 7), computed as
KL divergence against the smoothed target distribution."""
import torch
from torch import nn

from toolkit.utils.common import IGNORE_ID


class LabelSmoothingLoss(nn.Module):
    """KL(q || p) with q = (1 - smoothing) on the target and smoothing / (V - 1) elsewhere.

    With ``smoothing = 0`` it equals token-level cross entropy (summed, then normalised).

    Args:
        size: vocabulary size V.
        smoothing: probability mass spread over the non-target tokens, in [0, 1).
        padding_idx: target value of padded positions (excluded from loss and normaliser).
        normalize_length: divide by the number of valid tokens (True) or by the number of
            utterances (rows with at least one valid token; a row that is all padding is an
            utterance left out of the loss and does not count).

    Raises:
        ValueError: ``smoothing`` outside [0, 1) or ``size`` < 2.
    """

    def __init__(self, size: int, smoothing: float, padding_idx: int = IGNORE_ID,
                 normalize_length: bool = False):
        super().__init__()
        if not 0.0 <= smoothing < 1.0 or size < 2:
            raise ValueError(f"need 0 <= smoothing < 1 and size >= 2, got {smoothing}, {size}")
        self.size = size
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        self.padding_idx = padding_idx
        self.normalize_length = normalize_length

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Args:
            x: float32 (B, L, V) logits.
            target: int64 (B, L) token ids, ``padding_idx`` at padding.

        Returns:
            float32 scalar loss.
        """
        num_utts = (target != self.padding_idx).any(dim=1).sum().clamp(min=1)
        x = x.reshape(-1, self.size)
        target = target.reshape(-1)
        ignore = target == self.padding_idx
        target = target.masked_fill(ignore, 0)
        true_dist = torch.full_like(x, self.smoothing / (self.size - 1))
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        # kl_div treats 0 * log 0 as 0, so smoothing = 0 reduces exactly to cross entropy.
        kl = nn.functional.kl_div(torch.log_softmax(x, dim=1), true_dist, reduction="none")
        kl = kl.sum(dim=1).masked_fill(ignore, 0.0).sum()
        denom = (~ignore).sum().clamp(min=1) if self.normalize_length else num_utts
        return kl / denom
