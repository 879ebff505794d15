"""Convolutional front end that reduces the frame rate by 4 (10 ms -> 40 ms)."""
import torch
from torch import nn

RECEPTIVE_FIELD = 7  # input frames behind one output frame of two 3x3 stride-2 convolutions


class Conv2dSubsampling4(nn.Module):
    """Two 3x3 stride-2 Conv2d + ReLU layers, then a linear projection and positional encoding.

    No padding is used, so a subsampled frame exists only where the receptive field lies fully
    inside the input: T frames give ``((T - 1) // 2 - 1) // 2`` frames, and for a padded
    utterance of length l exactly the first ``((l - 1) // 2 - 1) // 2`` outputs depend on valid
    frames only (:meth:`output_lengths`). Output frame j covers input frames 4j .. 4j+6.

    An input shorter than the receptive field (T < 7 frames, under ~85 ms of audio) is padded to 7
    frames and gives one output frame marked invalid in the mask, so such a batch still runs
    through the encoder (a conv kernel larger than its input would raise) and the utterances in
    it simply have 0 valid frames.

    Args:
        idim: input feature size D (e.g. 80 fbank bins).
        odim: output size.
        pos_enc: a PositionalEncoding or RelPositionalEncoding of size ``odim`` (it also holds
            the front end's dropout).
        channels: conv channel count; 0 means ``odim`` (the usual choice). NOTE: the second conv costs
            ``channels**2 * 9 * D/4`` multiply-adds per 40 ms frame, about half of a small conformer's training
            time on CPU at channels = odim = 144; 32 channels cut that by 20x (see the CPU recipe's conf).
    """

    def __init__(self, idim: int, odim: int, pos_enc: nn.Module, channels: int = 0):
        super().__init__()
        channels = channels or odim
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, 2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, 2), nn.ReLU())
        self.out = nn.Linear(channels * (((idim - 1) // 2 - 1) // 2), odim)
        self.pos_enc = pos_enc
        self.receptive_field = RECEPTIVE_FIELD  # NOTE: an attribute, as TorchScript reads no globals

    @staticmethod
    def output_lengths(lengths: torch.Tensor) -> torch.Tensor:
        """int64 (B,) input frames -> int64 (B,) valid output frames, ``((l - 1) // 2 - 1) // 2``
        and 0 for ``l`` < 7."""
        return (((lengths - 1) // 2 - 1) // 2).clamp(min=0)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Subsample a padded batch.

        Args:
            x: float32 (B, T, D) features.
            x_mask: bool (B, 1, T), True at valid frames.

        Returns:
            x: float32 (B, T', odim) with T' = ((max(T, 7) - 1) // 2 - 1) // 2 >= 1.
            pos_emb: float32 (1, T', odim) or (1, 2T'-1, odim), from ``pos_enc``.
            mask: bool (B, 1, T'), True at subsampled frames computed from valid input only.

        Raises:
            RuntimeError: D differs from ``idim``.
        """
        short = self.receptive_field - x.size(1)
        if short > 0:
            x = nn.functional.pad(x, (0, 0, 0, short))
            x_mask = nn.functional.pad(x_mask, (0, short), value=False)
        x = self.conv(x.unsqueeze(1))
        batch, channels, time, freq = x.size()
        x = self.out(x.transpose(1, 2).reshape(batch, time, channels * freq))
        x, pos_emb = self.pos_enc(x)
        # Frame j of the output is valid iff input frame 4j+6 is: slicing at 2::2 twice
        # keeps exactly those mask entries.
        return x, pos_emb, x_mask[:, :, 2::2][:, :, 2::2]
