"""The residual connection around each sublayer, with LayerNorm (§3.1) and dropout (§5.4)."""

from __future__ import annotations

from .. import checks
from ..module import Module
from .dropout import Dropout
from .layernorm import LayerNorm


class SublayerConnection(Module):
    """Post-LN (the paper):  out = LayerNorm(x + Dropout(Sublayer(x)))
    Pre-LN (norm_first=True): out = x + Dropout(Sublayer(LayerNorm(x)))     Shapes: (B,T,D) -> (B,T,D)

    The sublayer (attention or feed-forward) is passed in as a function, so one class wraps all of them:
        x = self.sublayer(x, self.ffn.forward)                      # forward
        dx = self.sublayer.backward(dout, self.ffn.backward)        # backward
    ``sublayer_backward`` maps d(sublayer output) to d(sublayer input). A sublayer that reads more than x (the
    decoder's cross-attention reads the memory too) returns (d(its x input), its other gradient), and backward
    returns (dx, that gradient).
    The residual is explicit in backward: the gradient flows both through the sublayer and around it.
    Cache: held by the LayerNorm and Dropout children.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm = LayerNorm(d_model, eps)
        self.dropout = Dropout(dropout)
        self.norm_first = checks.boolean("SublayerConnection", "norm_first", norm_first)

    def forward(self, x, sublayer):                            # x (B,T,D)
        if self.norm_first:
            out = x + self.dropout.forward(sublayer(self.norm.forward(x)))   # (B,T,D)
        else:
            out = self.norm.forward(x + self.dropout.forward(sublayer(x)))   # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout, sublayer_backward):               # dout (B,T,D) -> dx (B,T,D) [, other gradient]
        self.saved(dout)
        if self.norm_first:                                    # out = x + Dropout(f(LN(x)))
            grads = sublayer_backward(self.dropout.backward(dout))
            dinput, *other = grads if isinstance(grads, tuple) else (grads,)
            dx = dout + self.norm.backward(dinput)             # around + through (f read LN(x): back through LN)
        else:                                                  # out = LN(x + Dropout(f(x)))
            dsum = self.norm.backward(dout)                    # d(x + Dropout(f(x)))
            grads = sublayer_backward(self.dropout.backward(dsum))
            dinput, *other = grads if isinstance(grads, tuple) else (grads,)
            dx = dsum + dinput                                 # around + through
        return (dx, *other) if other else dx

    def extra_repr(self):
        return f"norm_first={self.norm_first}"
