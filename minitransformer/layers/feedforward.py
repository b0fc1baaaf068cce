"""The position-wise feed-forward network of the paper's §3.3."""

from __future__ import annotations

from .. import checks
from ..module import Module
from .activations import ReLU
from .dropout import Dropout
from .linear import Linear


class PositionwiseFeedForward(Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two layers at every position.
                                                                     Shapes: (B,T,D) -> (B,T,F) -> (B,T,D)
    The optional dropout on the hidden activations is the one torch.nn.Transformer applies.
    Cache: held by the four child layers.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.d_model = checks.positive_int("PositionwiseFeedForward", "d_model", d_model)
        self.W1 = Linear(d_model, d_ff)
        self.relu = ReLU()
        self.dropout = Dropout(dropout)
        self.W2 = Linear(d_ff, d_model)

    def check_inputs(self, x):
        checks.float_array("PositionwiseFeedForward", "x", x, last_dim=self.d_model)

    def forward(self, x):                                      # x (B,T,D)
        h = self.relu.forward(self.W1.forward(x))              # max(0, x W1 + b1)   (B,T,F)
        out = self.W2.forward(self.dropout.forward(h))         # h W2 + b2           (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        self.saved(dout)
        dh = self.dropout.backward(self.W2.backward(dout))     # (B,T,F)
        return self.W1.backward(self.relu.backward(dh))        # (B,T,D)
