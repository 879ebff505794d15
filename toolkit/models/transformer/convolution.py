"""Conformer convolution module (Gulati et al., 2020, arXiv:2005.08100, section 2.2, figure 2)."""
import torch
from torch import nn


class ConvolutionModule(nn.Module):
    """Pointwise conv (D -> 2D) + GLU, depthwise conv, norm, activation, pointwise conv (D -> D).

    Padded frames are zeroed right before the depthwise convolution, the only step mixing
    frames, so a padded batch gives the same valid-frame outputs as each utterance alone.

    Args:
        channels: model size D.
        kernel_size: depthwise kernel width (odd, so 'same' padding is symmetric).
        activation: activation after the norm (Swish/SiLU in the paper).
        norm: ``"batch_norm"`` (the paper) or ``"layer_norm"`` (independent of batch content).
        bias: use biases in the convolutions.

    Raises:
        ValueError: even ``kernel_size`` or unknown ``norm``.
    """

    def __init__(self, channels: int, kernel_size: int, activation: nn.Module,
                 norm: str = "batch_norm", bias: bool = True):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"cnn_module_kernel must be odd, got {kernel_size}")
        if norm not in ("batch_norm", "layer_norm"):
            raise ValueError(f"cnn_module_norm must be batch_norm or layer_norm, got {norm!r}")
        self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size,
                                        padding=(kernel_size - 1) // 2, groups=channels,
                                        bias=bias)
        self.use_layer_norm = norm == "layer_norm"
        self.norm = nn.LayerNorm(channels) if self.use_layer_norm else nn.BatchNorm1d(channels)
        self.activation = activation
        self.pointwise_conv2 = nn.Conv1d(channels, channels, 1, bias=bias)

    def forward(self, x: torch.Tensor, mask_pad: torch.Tensor) -> torch.Tensor:
        """Args:
            x: float32 (B, T, D).
            mask_pad: bool (B, 1, T), True at valid frames.

        Returns:
            float32 (B, T, D); values at padded frames are unspecified.
        """
        x = nn.functional.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        x = self.depthwise_conv(x.masked_fill(~mask_pad, 0.0))
        if self.use_layer_norm:
            x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        else:
            x = self.norm(x)
        x = self.pointwise_conv2(self.activation(x))
        return x.transpose(1, 2)
