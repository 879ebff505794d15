"""Label-smoothed cross entropy (Szegedy et al., 2016, arXiv:1512.00567, section 7), as the KL divergence against
the smoothed target distribution."""
import math

import torch
from torch import nn

from toolkit.utils.common import IGNORE_ID


class LabelSmoothingLoss(nn.Module):
    """KL(q || p) with q = (1 - smoothing) on the target and smoothing / (V - 1) elsewhere.

    With ``smoothing = 0`` it equals token-level cross entropy (summed, then normalised). Computed through
    ``F.cross_entropy(label_smoothing=e)``, whose target is (1 - e) on the target and e / V everywhere: with
    e = smoothing * V / (V - 1) that is q, and KL(q || p) = CE(q, p) - H(q), H(q) a constant per token. NOTE: one fused
    kernel instead of a (B * L, V) target tensor, a scatter and an element-wise KL.

    Args:
        size: vocabulary size V.
        smoothing: probability mass spread over the non-target tokens, in [0, 1).
        padding_idx: target value of padded positions (excluded from loss and normaliser).
        normalize_length: divide by the number of valid tokens (True) or by the number of
            utterances (rows with at least one valid token; a row that is all padding is an
            utterance left out of the loss and does not count).

    Raises:
        ValueError: ``smoothing`` outside [0, (V - 1) / V] (beyond it the target would weigh less than another
            token) or ``size`` < 2.
    """

    def __init__(self, size: int, smoothing: float, padding_idx: int = IGNORE_ID,
                 normalize_length: bool = False):
        super().__init__()
        if size < 2 or not 0.0 <= smoothing <= (size - 1) / size:
            raise ValueError(f"need size >= 2 and 0 <= smoothing <= (size - 1) / size, got {smoothing}, {size}")
        self.size = size
        self.smoothing = smoothing
        self.padding_idx = padding_idx
        self.normalize_length = normalize_length
        self.torch_smoothing = smoothing * size / (size - 1)
        other = smoothing / (size - 1)  # q of each non-target token
        self.entropy = -sum(w * math.log(q) for w, q in ((1.0 - smoothing, 1.0 - smoothing), (smoothing, other))
                            if q > 0.0)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Args:
            x: float32 (B, L, V) logits.
            target: int64 (B, L) token ids, ``padding_idx`` at padding.

        Returns:
            float32 scalar loss.
        """
        num_utts = (target != self.padding_idx).any(dim=1).sum().clamp(min=1)
        num_tokens = (target != self.padding_idx).sum()
        cross_entropy = nn.functional.cross_entropy(x.reshape(-1, self.size), target.reshape(-1),
                                                    ignore_index=self.padding_idx, reduction="sum",
                                                    label_smoothing=self.torch_smoothing)
        kl = cross_entropy - num_tokens * self.entropy
        denom = num_tokens.clamp(min=1) if self.normalize_length else num_utts
        return kl / denom
