"""Conformer convolution module (Gulati et al., 2020, arXiv:2005.08100, section 2.2, figure 2)."""
import torch
from torch import nn


class ConvolutionModule(nn.Module):
    """Pointwise conv (D -> 2D) + GLU, depthwise conv, norm, activation, pointwise conv (D -> D).

    Padded frames are zeroed right before the depthwise convolution, the only step mixing
    frames, so a padded batch gives the same valid-frame outputs as each utterance alone.

    Causal (``causal``, U2's streaming conformer, arXiv:2012.05481): the depthwise convolution is padded with
    kernel_size - 1 frames on the left only, so output frame t reads frames t - kernel_size + 1 .. t and never a
    future one; chunk by chunk those left frames come from the cache of :meth:`forward_chunk` (zeros at the start
    of the stream, as the padding). The norm does not carry state across chunks: ``layer_norm`` normalises each
    frame alone, and ``batch_norm`` in eval mode is a fixed per-channel affine map (running statistics), so both
    give chunk by chunk what they give on the whole utterance. In training, BatchNorm's statistics are the batch's,
    future frames included, which decoding cannot reproduce; WeNet's streaming recipes therefore use
    ``cnn_module_norm: layer_norm``, the choice recommended here too (batch_norm stays allowed).

    Args:
        channels: model size D.
        kernel_size: depthwise kernel width (odd, so 'same' padding is symmetric; any when causal: WeNet's U2++
            recipes use 8).
        causal: left-only padding (see above).
        activation: activation after the norm (Swish/SiLU in the paper).
        norm: ``"batch_norm"`` (the paper) or ``"layer_norm"`` (independent of batch content).
        bias: use biases in the convolutions.

    Raises:
        ValueError: even ``kernel_size`` when not causal, or unknown ``norm``.
    """

    def __init__(self, channels: int, kernel_size: int, activation: nn.Module,
                 norm: str = "batch_norm", bias: bool = True, causal: bool = False):
        super().__init__()
        if kernel_size % 2 == 0 and not causal:
            raise ValueError(f"cnn_module_kernel must be odd (or causal: true, left-only padding), got {kernel_size}")
        if norm not in ("batch_norm", "layer_norm"):
            raise ValueError(f"cnn_module_norm must be batch_norm or layer_norm, got {norm!r}")
        # NOTE: the module works on (B, T, D) throughout: the pointwise convolutions are linear layers (the same
        # function and initialisation as kernel-1 Conv1d) and the depthwise one is a (1, K) Conv2d on the
        # (B, D, 1, T) view of (B, T, D) memory, which is channels-last: no transposed copies (docs/benchmarks.md).
        self.pointwise_conv1 = nn.Linear(channels, 2 * channels, bias=bias)
        # Frames of left context the causal convolution pads itself (its cache), 0 when not causal.
        self.lorder = kernel_size - 1 if causal else 0
        self.depthwise_conv = nn.Conv2d(channels, channels, (1, kernel_size),
                                        padding=(0, 0 if causal else (kernel_size - 1) // 2), groups=channels,
                                        bias=bias)
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
        return self.forward_chunk(x, mask_pad, x.new_zeros(0, 0, 0))[0]

    def forward_chunk(self, x: torch.Tensor, mask_pad: torch.Tensor, cache: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` on a chunk of a stream, after the frames whose depthwise-convolution input ``cache``
        holds (causal only).

        Args:
            x: float32 (B, C, D).
            mask_pad: bool (B, 1, C), True at valid frames.
            cache: float32 (B, D, kernel_size - 1), the depthwise convolution's input at the frames before the
                chunk, or (0, 0, 0): zeros (the stream's start, or a module that is not causal).

        Returns:
            float32 (B, C, D), and the new cache: (B, D, kernel_size - 1) from the chunk's end when causal,
            (0, 0, 0) otherwise.
        """
        x = nn.functional.glu(self.pointwise_conv1(x), dim=-1)  # (B, C, D)
        x = x.masked_fill(~mask_pad.transpose(1, 2), 0.0)
        new_cache = x.new_zeros(0, 0, 0)
        if self.lorder > 0:
            if cache.size(0) == 0:
                x = nn.functional.pad(x, (0, 0, self.lorder, 0))
            else:
                x = torch.cat([cache.transpose(1, 2), x], dim=1)  # (B, kernel_size - 1 + C, D)
            new_cache = x[:, x.size(1) - self.lorder:].transpose(1, 2)
        x = self.depthwise_conv(x.transpose(1, 2).unsqueeze(2))  # (B, D, 1, C) channels-last
        if self.use_layer_norm:
            x = self.norm(x.squeeze(2).transpose(1, 2))
        else:
            x = self.norm(x).squeeze(2).transpose(1, 2)  # batch statistics over (B, T) per channel
        return self.pointwise_conv2(self.activation(x)), new_cache
