"""Dropout (Srivastava et al., 2014, "Dropout: A Simple Way to Prevent Neural Networks from Overfitting", JMLR 15)."""
import torch
from torch import nn


class _KeepAndScale(torch.autograd.Function):
    """x * keep * scale, and grad * keep * scale back: one pass each way, only the bool mask saved (torch's
    ``native_dropout_backward`` kernel, which computes exactly this, does both)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, keep, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None, None


class Dropout(nn.Module):
    """Inverted dropout: in training each element is zeroed with probability ``p`` and the others are scaled by
    1 / (1 - p); the identity in eval mode (or with ``p`` 0). Drop-in for ``nn.Dropout``.

    On CPU an element is kept when 15 uniform random bits are at least ``round(p * 2**15)`` (``p`` resolved to
    2**-15): each 31-bit integer drawn from torch's default generator, viewed as two 16-bit halves with their sign
    bit masked off, serves two elements. NOTE: torch's own CPU dropout draws its mask with ``bernoulli_``, about
    4x slower than this (one draw per element and compare: 2x), and it ran at 10 % of a conformer training step
    (docs/benchmarks.md). Other devices use ``nn.functional.dropout`` (a fused kernel on GPU).
    Both draw from torch's seeded generators, so runs and resumed runs repeat their masks.

    Args:
        p: drop probability in [0, 1].

    Raises:
        ValueError: ``p`` outside [0, 1].
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p
        self.threshold = round(p * 2 ** 15)
        self.scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: any shape -> the same shape and dtype."""
        if not self.training or self.p == 0.0:
            return x
        if torch.jit.is_scripting() or x.device.type != "cpu":
            return nn.functional.dropout(x, self.p, True)
        return self._cpu_dropout(x)

    @torch.jit.unused
    def _cpu_dropout(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: the functional aten.random, not Tensor.random_ (the same draws from the same generator): torch.compile
        # cannot trace the in-place op and would break the graph at every dropout (train_conf.compile).
        n = x.numel()
        draws = torch.ops.aten.random(torch.empty((n + 1) // 2, dtype=torch.int32))
        keep = (draws.view(torch.int16)[:n].view(x.shape) & 0x7FFF) >= self.threshold
        if torch.compiler.is_compiling():
            # NOTE: compiled, the op itself (its derivative is the same op; inductor fuses it and saves only the
            # mask): dynamo (torch 2.13) cannot trace _KeepAndScale when the scale is an attribute of a compiled
            # module ("lift_tracked_freevar_to_input should not be called on root SubgraphTracer").
            return torch.ops.aten.native_dropout_backward(x, keep, self.scale)
        return _KeepAndScale.apply(x, keep, self.scale)

    def extra_repr(self) -> str:
        return f"p={self.p}"
