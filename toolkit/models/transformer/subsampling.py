"""Convolutional front ends that reduce the frame rate by 4 (10 ms -> 40 ms) or 8 (-> 80 ms)."""
import torch
from torch import nn

NUM_LAYERS = {4: 2, 8: 3}  # subsampling rate -> 3x3 stride-2 convolutions


class _Stride2Conv2d(torch.autograd.Function):
    """``conv2d(x, weight, bias, stride=2)`` on channels-last tensors, whose weight gradient is one
    matrix product per kernel tap: grad_w[:, :, i, j] = grad^T (O, N) @ x_tap(i, j) (N, C), N =
    B * T' * D' output positions.

    NOTE: the weight gradient of this layer is the largest single cost of a conformer training step
    on CPU. oneDNN 3.12 (torch 2.13) computes it at under half of the matrix-multiply rate on
    channels-last input, and on contiguous input it is the input gradient that is slow; the nine
    matrix products, plus copying each tap's rows, take 0.55-0.65x its time (docs/benchmarks.md).
    Forward and input gradient stay oneDNN's.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            # NOTE: cast here as autocast casts conv2d's inputs, and saved so: the backward's products then run
            # in the dtype of the forward (bf16 activations with the float32 weight saved made oneDNN's
            # convolution_backward fail on CPUs without native bf16, "expected scalar type BFloat16 but found
            # Float"); autograd casts the gradients back to each input's dtype.
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        ctx.save_for_backward(x, weight)
        return nn.functional.conv2d(x, weight, bias, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous(memory_format=torch.channels_last)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1,
                [True, False, False])[0]
        _, out_channels, out_time, out_freq = grad.shape
        rows = grad.permute(0, 2, 3, 1).reshape(-1, out_channels)  # (N, O), a view
        frames = x.permute(0, 2, 3, 1)  # (B, T, D, C), contiguous in channels-last
        grad_w = weight.new_empty(out_channels, 3, 3, weight.size(1))
        tap = x.new_empty(rows.size(0), weight.size(1))  # (N, C), one buffer for the nine taps
        for i in range(3):
            for j in range(3):
                tap.view(grad.size(0), out_time, out_freq, -1).copy_(
                    frames[:, i:i + 2 * out_time - 1:2, j:j + 2 * out_freq - 1:2])
                grad_w[:, i, j] = rows.t() @ tap
        return grad_x, grad_w.permute(0, 3, 1, 2), grad.sum((0, 2, 3))


class PatchConvReLU(nn.Module):
    """The first 3x3 stride-2 convolution (one input channel, no padding) + ReLU as a product of 3x3 patches with
    the (C, 9) weight: (B, T, D) -> (B, C, (T - 1) // 2, (D - 1) // 2), channels-last as it comes out of the
    product. Parameters are ``nn.Conv2d(1, C, 3, 2)``'s, in its layout and initialisation.

    Args:
        channels: C.
    """

    def __init__(self, channels: int):
        super().__init__()
        conv = nn.Conv2d(1, channels, 3, 2)
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 (B, T, D), T >= 3, D >= 3 -> float32 (B, C, T', D') channels-last."""
        patches = x.unfold(1, 3, 2).unfold(2, 3, 2)  # (B, T', D', 3, 3)
        batch, time, freq = patches.size(0), patches.size(1), patches.size(2)
        weight = self.weight.view(self.weight.size(0), 9)
        # NOTE: ReLU in place on the matrix product itself, not on a view of it (autograd would
        # then rebuild the base tensor in the backward pass: three more copies of it).
        x = torch.relu_(torch.addmm(self.bias, patches.reshape(-1, 9), weight.t()))  # (N, C)
        return x.view(batch, time, freq, -1).permute(0, 3, 1, 2)


class Stride2ConvReLU(nn.Module):
    """A C -> C 3x3 stride-2 convolution without padding + ReLU on channels-last input: (B, C, T, D) ->
    (B, C, (T - 1) // 2, (D - 1) // 2), channels-last. It runs as oneDNN/cuDNN channels-last convolution, with the
    weight gradient of :class:`_Stride2Conv2d` on CPU. Parameters are ``nn.Conv2d(C, C, 3, 2)``'s, in its layout
    ((C_out, C_in, 3, 3), contiguous), so DDP's buckets, DeepSpeed's flattening and checkpoints see ordinary
    tensors; the channels-last copy of the weight is made in the graph.

    Args:
        channels: C.
    """

    def __init__(self, channels: int):
        super().__init__()
        conv = nn.Conv2d(channels, channels, 3, 2)
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 (B, C, T, D) channels-last, T, D >= 3 -> float32 (B, C, T', D') channels-last."""
        weight = self.weight.contiguous(memory_format=torch.channels_last)
        if torch.jit.is_scripting() or x.device.type != "cpu":
            x = nn.functional.conv2d(x, weight, self.bias, 2)
        else:
            x = self._stride2_conv2d(x, weight)
        return torch.relu_(x)

    @torch.jit.unused
    def _stride2_conv2d(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _Stride2Conv2d.apply(x, weight, self.bias)


class Conv2dSubsampling(nn.Module):
    """3x3 stride-2 Conv2d + ReLU layers, two for 4x subsampling (``input_layer: conv2d``, 40 ms frames) or three for
    8x (``conv2d8``, 80 ms), then a linear projection and positional encoding.

    The layers are ``conv``: a :class:`PatchConvReLU`, then :class:`Stride2ConvReLU` s. ReLUs are in place: no
    convolution needs its output for the backward pass, so the largest activation of the model, (B, C, T/2, D/2),
    is stored once. No padding is used, so a subsampled frame exists only where the receptive field (7 input frames
    for 4x, 15 for 8x) lies fully inside the input: each layer maps l frames to ``(l - 1) // 2``, and for a padded
    utterance of length l exactly the first of those outputs depend on valid frames only (:meth:`output_lengths`).
    Output frame j covers input frames rate*j .. rate*j + receptive field - 1.

    An input shorter than the receptive field (under ~85 ms of audio for 4x, ~165 ms for 8x) is padded to it and
    gives one output frame marked invalid in the mask, so such a batch still runs through the encoder (a conv
    kernel larger than its input would raise) and the utterances in it simply have 0 valid frames.

    Args:
        idim: input feature size D (e.g. 80 fbank bins).
        odim: output size.
        pos_enc: a PositionalEncoding or RelPositionalEncoding of size ``odim`` (it also holds
            the front end's dropout).
        channels: conv channel count; 0 means ``odim`` (the usual choice). NOTE: the second conv costs
            ``channels**2 * 9 * D/4`` multiply-adds per 40 ms frame, about half of a small conformer's training
            time on CPU at channels = odim = 144; 32 channels cut that by 20x (see the CPU recipe's conf).
        rate: 4 or 8.

    Raises:
        ValueError: another ``rate``.
    """

    def __init__(self, idim: int, odim: int, pos_enc: nn.Module, channels: int = 0, rate: int = 4):
        super().__init__()
        if rate not in NUM_LAYERS:
            raise ValueError(f"subsampling rate must be one of {sorted(NUM_LAYERS)}, got {rate}")
        channels = channels or odim
        self.num_layers = NUM_LAYERS[rate]
        self.conv = nn.Sequential(PatchConvReLU(channels),
                                  *(Stride2ConvReLU(channels) for _ in range(self.num_layers - 1)))
        freq = idim
        for _ in range(self.num_layers):
            freq = (freq - 1) // 2
        self.out = nn.Linear(channels * freq, odim)
        self.pos_enc = pos_enc
        self.rate = rate
        self.receptive_field = 2 ** (self.num_layers + 1) - 1

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """int64 (B,) input frames -> int64 (B,) valid output frames: ``(l - 1) // 2`` once per layer (for 4x
        ``((l - 1) // 2 - 1) // 2``), 0 for ``l`` under the receptive field."""
        for _ in range(self.num_layers):
            lengths = (lengths - 1) // 2
        return lengths.clamp(min=0)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, offset: int = 0, cached: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Subsample a padded batch.

        Args:
            x: float32 (B, T, D) features.
            x_mask: bool (B, 1, T), True at valid frames.
            offset, cached: for a chunk of a stream, the index of its first output frame in the stream and the
                frames before it that attention sees (``pos_enc``'s arguments); 0 and 0 for a whole utterance.

        Returns:
            x: float32 (B, T', odim) with T' = :meth:`output_lengths` of max(T, receptive field) >= 1.
            pos_emb: float32 (1, T', odim) or (1, cached + 2T'-1, odim), from ``pos_enc``.
            mask: bool (B, 1, T'), True at subsampled frames computed from valid input only.

        Raises:
            RuntimeError: D differs from ``idim``.
        """
        short = self.receptive_field - x.size(1)
        if short > 0:
            x = nn.functional.pad(x, (0, 0, 0, short))
            x_mask = nn.functional.pad(x_mask, (0, short), value=False)
        x = self.conv(x)
        batch, channels, time, freq = x.size()
        x = self.out(x.transpose(1, 2).reshape(batch, time, channels * freq))
        x, pos_emb = self.pos_enc(x, offset, cached)
        # Frame j of a layer's output is valid iff its input frame 2j+2 is, so output frame j iff input frame
        # (receptive field - 1) + rate * j is (2::2 once per layer, in one slice). NOTE: one slice, so that
        # torch.export sees the mask's length as the same expression as x's ((T - 3) // 4); the layer-by-layer slices
        # gave an equal one it cannot prove equal (torch.onnx export failed on it, torch 2.13).
        x_mask = x_mask[:, :, self.receptive_field - 1::self.rate]
        return x, pos_emb, x_mask
