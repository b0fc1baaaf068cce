"""The position-wise feed-forward network of the paper's §3.3."""

from __future__ import annotations

from ..module import Module
from ._checks import check_positive_int, check_probability
from .activations import ReLU
from .dropout import Dropout
from .linear import Linear


class PositionwiseFeedForward(Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two layers at every position.
                                                                     Shapes: (B,T,D) -> (B,T,F) -> (B,T,D)
    Any leading axes work: inside the Transformer x is the packed (N,D) rows of the real tokens.
    The optional dropout on the hidden activations is the one torch.nn.Transformer applies.
    Cache: held by the four child layers.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        check_positive_int("PositionwiseFeedForward", "d_model", d_model)
        check_positive_int("PositionwiseFeedForward", "d_ff", d_ff)
        check_probability("PositionwiseFeedForward", "dropout", dropout)
        self.W1 = Linear(d_model, d_ff)
        # Speed: ReLU and dropout work in place on the hidden activations h (B,T,F) -- W1's fresh output,
        # which no cache holds -- and, in backward, on the fresh gradient W2.backward returns. That saves
        # four (B,T,F) temporaries per call, the widest arrays of a layer (measured ~7% of a base-sized
        # feed-forward's forward + backward). W2 caches its input, the final h, so nothing it needs changes.
        self.relu = ReLU(inplace=True)
        self.dropout = Dropout(dropout, inplace=True)
        self.W2 = Linear(d_ff, d_model)

    def forward(self, x):                                      # x (B,T,D)
        h = self.relu(self.W1(x))                              # max(0, x W1 + b1)   (B,T,F)
        return self.W2(self.dropout(h))                        # h W2 + b2           (B,T,D)

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        dh = self.dropout.backward(self.W2.backward(dout))     # (B,T,F)
        return self.W1.backward(self.relu.backward(dh))        # (B,T,D)
