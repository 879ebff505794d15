"""CTC output head (Graves et al., 2006, "Connectionist Temporal Classification")."""
import torch
from torch import nn

from toolkit.models.transformer.dropout import Dropout
from toolkit.utils.common import BLANK_ID, IGNORE_ID
from toolkit.utils.mask import make_pad_mask


def min_ctc_frames(ys_pad: torch.Tensor, ys_lens: torch.Tensor) -> torch.Tensor:
    """Fewest frames a CTC alignment of each target needs: its length plus one blank between
    each pair of equal adjacent labels (Graves et al., 2006, section 3.1), e.g. 5 for "HELLO".

    Args:
        ys_pad: int64 (B, L) targets padded with IGNORE_ID.
        ys_lens: int64 (B,) target lengths.

    Returns:
        int64 (B,).
    """
    if ys_pad.size(1) < 2:
        return ys_lens.clone()
    valid = ~make_pad_mask(ys_lens, ys_pad.size(1))[:, 1:]
    repeats = (ys_pad[:, 1:] == ys_pad[:, :-1]) & valid & (ys_pad[:, 1:] != IGNORE_ID)
    return ys_lens + repeats.sum(dim=1)


class CTC(nn.Module):
    """Linear projection of encoder states to the vocabulary plus the CTC loss.

    With ``upsample`` k > 1 one linear layer projects each encoder frame to k distributions over the vocabulary, so
    CTC aligns the target with k x T' frames while the encoder's work stays that of T' (as in Libovický & Helcl,
    2018, arXiv:1811.04719, for non-autoregressive translation): for speech faster than a unit per encoder frame. The
    shipped FSDD digits are trimmed to the word, and 24 of the 500 of its dev set have no CTC alignment with
    characters at 40 ms and k = 1 (a "THREE" of 0.25 s: 5 encoder frames for T H R E blank E); k = 2 aligns them,
    but trained 10 epochs it learned the rest more slowly (``docs/recipe_ablation.md``, c10u), so the recipe keeps 1.

    Args:
        odim: vocabulary size V (``<blank>`` = 0).
        encoder_output_size: encoder model size D.
        dropout_rate: dropout on the encoder states before the projection.
        upsample: CTC frames per encoder frame, an integer >= 1 (``ctc_conf.upsample``).

    Raises:
        ValueError: ``upsample`` is not an integer >= 1.
    """

    def __init__(self, odim: int, encoder_output_size: int, dropout_rate: float = 0.0, upsample: int = 1):
        super().__init__()
        if isinstance(upsample, bool) or not isinstance(upsample, int) or upsample < 1:
            raise ValueError(f"upsample must be an integer >= 1, got {upsample!r}")
        self.upsample = upsample
        self.ctc_lo = nn.Linear(encoder_output_size, odim * upsample)
        self.dropout = Dropout(dropout_rate)

    def output_lengths(self, hlens: torch.Tensor) -> torch.Tensor:
        """int64 (B,) valid encoder frames -> int64 (B,) valid CTC frames (``upsample`` x as many)."""
        return hlens * self.upsample

    def _logits(self, hs_pad: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) -> float32 (B, upsample * T', V); CTC frame ``t * upsample + j`` is the j-th of
        encoder frame t."""
        logits = self.ctc_lo(hs_pad)  # (B, T', upsample * V)
        return logits.reshape(logits.size(0), logits.size(1) * self.upsample, -1)

    @torch.jit.unused  # training only; a scripted encoder holds this head for its posteriors (self-conditioning)
    def forward(self, hs_pad: torch.Tensor, hlens: torch.Tensor, ys_pad: torch.Tensor,
                ys_lens: torch.Tensor) -> torch.Tensor:
        """CTC loss of each utterance, -log P(y | x) summed over alignments.

        Args:
            hs_pad: float32 (B, T', D) encoder output.
            hlens: int64 (B,) valid encoder frames.
            ys_pad: int64 (B, L) targets padded with IGNORE_ID (padding is never read).
            ys_lens: int64 (B,) target lengths.

        Returns:
            float32 (B,) losses. An utterance with no alignment (:meth:`output_lengths` of ``hlens`` <
            ``ys_lens`` + the number of adjacent repeated labels, see :func:`min_ctc_frames`) gets ``inf``: it is
            not hidden as 0 (no ``zero_infinity``); the caller leaves such utterances out.
        """
        log_probs = self._logits(self.dropout(hs_pad)).log_softmax(dim=2)
        return nn.functional.ctc_loss(log_probs.transpose(0, 1), ys_pad, self.output_lengths(hlens), ys_lens,
                                      blank=BLANK_ID, reduction="none", zero_infinity=False)

    def posteriors(self, hs_pad: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) -> float32 (B, T', upsample * V): each encoder frame's ``upsample`` CTC frame
        posteriors side by side (each V-slice sums to 1), for self-conditioning."""
        probs = self._logits(hs_pad).softmax(dim=2)
        return probs.reshape(hs_pad.size(0), hs_pad.size(1), -1)

    def log_softmax(self, hs_pad: torch.Tensor) -> torch.Tensor:
        """float32 (B, T', D) -> float32 (B, upsample * T', V) CTC frame log-posteriors (valid frames: the
        :meth:`output_lengths` of the encoder's)."""
        return self._logits(hs_pad).log_softmax(dim=2)
