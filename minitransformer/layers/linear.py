"""Linear (fully connected) layer:  out = x W + b."""

from __future__ import annotations

import math

from .. import backend
from ..module import Module, Parameter
from ._checks import check_last_dim, check_positive_int


def xavier_uniform(fan_in: int, fan_out: int, shape=None):
    """Glorot/Xavier uniform init, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).

    Drawn on the host with the seeded generator, so one seed gives the same weights on every backend.
    """
    a = math.sqrt(6.0 / (fan_in + fan_out))
    shape = (fan_in, fan_out) if shape is None else shape
    return backend.host_rng().uniform(-a, a, size=shape)


class Linear(Module):
    """out = x W + b, applied to the last axis.            Shapes: (..., in_features) -> (..., out_features)

    W is stored as (in_features, out_features) so the code reads like the paper's ``x W``
    (PyTorch stores the transpose). The matmul runs on a 2-D view (N, in) of the input: one large
    GEMM is much faster than a stack of small ones.
    Cache: the input x (as its 2-D view), all backward needs for dW; W for dx.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        check_positive_int("Linear", "in_features", in_features)
        check_positive_int("Linear", "out_features", out_features)
        self.in_features, self.out_features = in_features, out_features
        self.W = Parameter(xavier_uniform(in_features, out_features))   # (in, out)
        self.b = Parameter(backend.xp().zeros(out_features)) if bias else None  # (out,)

    def forward(self, x):                                   # x (..., in)
        check_last_dim("Linear", "x", x, self.in_features)
        self.x2d = x.reshape(-1, self.in_features)         # (N, in), a view
        out = self.x2d @ self.W.data                        # (N, out)
        if self.b is not None:
            out += self.b.data                              # in place: `out` is a fresh array no cache holds
        return out.reshape(*x.shape[:-1], self.out_features)  # (..., out)

    def backward(self, dout):                               # dout (..., out)
        dout2d = dout.reshape(-1, self.out_features)        # (N, out)
        self.W.grad += self.x2d.T @ dout2d                  # dW = x^T dout      (in, out)
        if self.b is not None:
            self.b.grad += dout2d.sum(axis=0)               # db = sum_n dout    (out,)
        dx = dout2d @ self.W.data.T                         # dx = dout W^T      (N, in)
        self.x2d = None
        return dx.reshape(*dout.shape[:-1], self.in_features)  # (..., in)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.b is not None}"
