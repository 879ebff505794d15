"""CTC output head (Graves et al., 2006, "Connectionist Temporal Classification")."""
import torch
from torch import nn

from toolkit.utils.common import BLANK_ID


class CTC(nn.Module):
    """Linear projection of encoder states to the vocabulary plus the CTC loss.

    Args:
        odim: vocabulary size V (``<blank>`` = 0).
        encoder_output_size: encoder model size D.
        dropout_rate: dropout on the encoder states before the projection.
    """

    def __init__(self, odim: int, encoder_output_size: int, dropout_rate: float = 0.0):
        super().__init__()
        self.ctc_lo = nn.Linear(encoder_output_size, odim)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, hs_pad: torch.Tensor, hlens: torch.Tensor, ys_pad: torch.Tensor,
                ys_lens: torch.Tensor) -> torch.Tensor:
        """CTC loss summed over utterances and divided by the batch size B.

        Args:
            hs_pad: float32 (B, T', D) encoder output.
            hlens: int64 (B,) valid encoder frames.
            ys_pad: int64 (B, L) targets padded with IGNORE_ID (padding is never read).
            ys_lens: int64 (B,) target lengths.

        Returns:
            float32 scalar. Utterances too short for their targets (infinite loss) count as 0
            (``zero_infinity``) so one bad sample cannot turn the batch gradient into NaN.
        """
        log_probs = self.ctc_lo(self.dropout(hs_pad)).log_softmax(dim=2)
        loss = nn.functional.ctc_loss(log_probs.transpose(0, 1), ys_pad, hlens, ys_lens,
                                      blank=BLANK_ID, reduction="sum", zero_infinity=True)
        return loss / hs_pad.size(0)

    def log_softmax(self, hs_pad: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) -> float32 (B, T', V) frame-level log-posteriors."""
        return self.ctc_lo(hs_pad).log_softmax(dim=2)

    def argmax(self, hs_pad: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) -> int64 (B, T') best token per frame."""
        return self.ctc_lo(hs_pad).argmax(dim=2)
