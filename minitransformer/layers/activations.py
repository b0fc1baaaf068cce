"""Elementwise and row-wise nonlinearities: ReLU and Softmax."""

from __future__ import annotations

from .. import backend
from ..module import Module
from ._checks import check_float_array


class ReLU(Module):
    """out = max(0, x).                                                      Shapes: (...) -> (...)
    Cache: the boolean mask x > 0; the derivative is 1 there and 0 elsewhere.

    inplace=True writes the result into the array it is given: forward overwrites x with max(0, x) and
    backward overwrites dout with dx. Only for arrays no one else holds (PositionwiseFeedForward's hidden
    activations and their gradient); the default leaves both untouched.
    """

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x):
        check_float_array("ReLU", "x", x)
        self.positive = x > 0                                  # (...) bool
        return backend.xp().maximum(x, 0, out=x if self.inplace else None)  # max(0, x) (...); faster than x * mask

    def backward(self, dout):
        dx = backend.xp().multiply(dout, self.positive, out=dout if self.inplace else None)  # dReLU/dx = 1[x > 0]
        self.positive = None
        return dx

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Softmax(Module):
    """p_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x)) along ``axis``.     Shapes: (...) -> (...)

    Subtracting the row maximum changes nothing mathematically (it cancels) but keeps exp from
    overflowing, so logits around 1e4 are fine.
    Backward without the Jacobian matrix:  dx = p * (dout - sum(p * dout, axis)).
    Cache: the output p.
    """

    def __init__(self, axis: int = -1):
        super().__init__()
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"Softmax: axis must be an int, got {axis!r}")
        self.axis = axis

    def forward(self, x):
        xp = backend.xp()
        check_float_array("Softmax", "x", x)
        if not -x.ndim <= self.axis < x.ndim:
            raise ValueError(f"Softmax: axis={self.axis} does not exist in x of shape {tuple(x.shape)}")
        e = x - x.max(axis=self.axis, keepdims=True)           # (...) every row's max is 0
        xp.exp(e, out=e)                                       # (...) in place: e is ours (speed: no new array)
        e /= e.sum(axis=self.axis, keepdims=True)              # (...) in place: p
        self.p = e
        return self.p

    def backward(self, dout):
        xp = backend.xp()
        p = self.p
        dx = p * dout                                          # (...) a buffer of ours
        s = dx.sum(axis=self.axis, keepdims=True)              # sum(p * dout, axis)
        dx = xp.multiply(p, xp.subtract(dout, s, out=dx), out=dx)  # p * (dout - s), in place in dx
        self.p = None
        return dx

    def extra_repr(self):
        return f"axis={self.axis}"
