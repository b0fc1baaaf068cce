"""Linear (fully connected) layer:  out = x W + b."""

from __future__ import annotations

import math

from .. import backend, checks
from ..module import Module, Parameter


def xavier_uniform(fan_in: int, fan_out: int):
    """Glorot/Xavier uniform init, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).      Returns (fan_in, fan_out)
    Drawn on the host with the seeded generator, so one seed gives the same weights on every backend."""
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return backend.host_rng().uniform(-a, a, size=(fan_in, fan_out))


class Linear(Module):
    """out = x W + b, applied to the last axis.            Shapes: (..., in_features) -> (..., out_features)

    W is stored as (in_features, out_features) so the code reads like the paper's ``x W``
    (PyTorch stores the transpose).
    Cache: the input x, all backward needs for dW (and W itself for dx).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features = checks.positive_int("Linear", "in_features", in_features)
        self.out_features = checks.positive_int("Linear", "out_features", out_features)
        self.W = Parameter(xavier_uniform(in_features, out_features))            # (in, out)
        self.b = Parameter(backend.xp().zeros(out_features)) if bias else None  # (out,)

    def check_inputs(self, x):
        checks.float_array("Linear", "x", x, last_dim=self.in_features)

    def forward(self, x):                                       # x (..., in)
        out = x @ self.W.data                                   # x W       (..., out)
        if self.b is not None:
            out = out + self.b.data                             # x W + b   (..., out)
        self.save_for_backward(out, x=x)
        return out

    def backward(self, dout):                                   # dout (..., out) -> dx (..., in)
        x = self.saved(dout).x                                  # (..., in)
        x2d = x.reshape(-1, self.in_features)                   # (N, in): every position is a row
        dout2d = dout.reshape(-1, self.out_features)            # (N, out)
        self.W.grad += x2d.T @ dout2d                           # dW = x^T dout, summed over rows  (in, out)
        if self.b is not None:
            self.b.grad += dout2d.sum(axis=0)                   # db = sum_n dout                  (out,)
        return dout @ self.W.data.T                             # dx = dout W^T                    (..., in)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.b is not None}"
