"""Elementwise and row-wise nonlinearities: ReLU and Softmax."""

from __future__ import annotations

from .. import backend, checks
from ..module import Module


class ReLU(Module):
    """out = max(0, x).                                                      Shapes: (...) -> (...)
    Cache: where x > 0; the derivative is 1 there and 0 elsewhere."""

    def check_inputs(self, x):
        checks.float_array("ReLU", "x", x)

    def forward(self, x):
        out = backend.xp().maximum(x, 0)                       # (...)
        self.save_for_backward(out, positive=x > 0)
        return out

    def backward(self, dout):
        return dout * self.saved(dout).positive                # dReLU/dx = 1[x > 0]


class Softmax(Module):
    """p_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x)) along ``axis``.     Shapes: (...) -> (...)

    Subtracting the row maximum changes nothing mathematically (it cancels) but keeps exp from
    overflowing, so logits around 1e4 are fine.
    Backward without the Jacobian matrix:  dx = p * (dout - sum(p * dout, axis)).
    Cache: the output p.
    """

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = checks.integer("Softmax", "axis", axis)

    def check_inputs(self, x):
        checks.float_array("Softmax", "x", x)
        if not -x.ndim <= self.axis < x.ndim:
            raise ValueError(f"Softmax: axis={self.axis} does not exist in x of shape {tuple(x.shape)}")

    def forward(self, x):
        e = backend.xp().exp(x - x.max(axis=self.axis, keepdims=True))   # (...) the row's max becomes exp(0) = 1
        p = e / e.sum(axis=self.axis, keepdims=True)                    # (...) rows sum to 1
        self.save_for_backward(p, p=p)
        return p

    def backward(self, dout):
        p = self.saved(dout).p
        return p * (dout - (p * dout).sum(axis=self.axis, keepdims=True))   # dx = p * (dout - sum(p * dout))

    def extra_repr(self):
        return f"axis={self.axis}"
