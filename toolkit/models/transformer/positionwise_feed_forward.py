"""Position-wise feed-forward block (Vaswani et al., 2017, arXiv:1706.03762, section 3.3)."""
import torch
from torch import nn

from toolkit.models.transformer.dropout import Dropout


class PositionwiseFeedForward(nn.Module):
    """Linear(D -> hidden) -> activation -> dropout -> Linear(hidden -> D), applied per frame.

    Args:
        idim: model size D.
        hidden_units: inner size (``linear_units`` in the config).
        dropout_rate: dropout after the activation.
        activation: activation module (ReLU for Transformer, Swish/SiLU for Conformer).
    """

    def __init__(self, idim: int, hidden_units: int, dropout_rate: float,
                 activation: nn.Module):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.activation = activation
        self.dropout = Dropout(dropout_rate)
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: float32 (B, T, D) -> float32 (B, T, D)."""
        return self.w_2(self.dropout(self.activation(self.w_1(x))))
