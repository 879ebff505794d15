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
        # NOTE: the module works on (B, T, D) throughout: the pointwise convolutions are linear layers (the same
        # function and initialisation as kernel-1 Conv1d) and the depthwise one is a (1, K) Conv2d on the
        # (B, D, 1, T) view of (B, T, D) memory, which is channels-last: no transposed copies (docs/benchmarks.md).
        self.pointwise_conv1 = nn.Linear(channels, 2 * channels, bias=bias)
        self.depthwise_conv = nn.Conv2d(channels, channels, (1, kernel_size),
                                        padding=(0, (kernel_size - 1) // 2), groups=channels, bias=bias)
        # NOTE: its weight is kept channels-last, the layout of the gradient the channels-last convolution returns:
        # DDP's gradient buckets follow each parameter's strides, so a contiguous weight made DDP copy (and warn
        # about) that gradient every step.
        weight = self.depthwise_conv.weight.data  # (D, 1, 1, K)
        channels_last = torch.empty_strided(weight.shape, (kernel_size, 1, kernel_size, 1), dtype=weight.dtype)
        self.depthwise_conv.weight.data = channels_last.copy_(weight)
        self.use_layer_norm = norm == "layer_norm"
        self.norm = nn.LayerNorm(channels) if self.use_layer_norm else nn.BatchNorm2d(channels)
        self.activation = activation
        self.pointwise_conv2 = nn.Linear(channels, channels, bias=bias)

    def forward(self, x: torch.Tensor, mask_pad: torch.Tensor) -> torch.Tensor:
        """Args:
            x: float32 (B, T, D).
            mask_pad: bool (B, 1, T), True at valid frames.

        Returns:
            float32 (B, T, D); values at padded frames are unspecified.
        """
        x = nn.functional.glu(self.pointwise_conv1(x), dim=-1)  # (B, T, D)
        x = x.masked_fill(~mask_pad.transpose(1, 2), 0.0)
        x = self.depthwise_conv(x.transpose(1, 2).unsqueeze(2))  # (B, D, 1, T) channels-last
        if self.use_layer_norm:
            x = self.norm(x.squeeze(2).transpose(1, 2))
        else:
            x = self.norm(x).squeeze(2).transpose(1, 2)  # batch statistics over (B, T) per channel
        return self.pointwise_conv2(self.activation(x))
