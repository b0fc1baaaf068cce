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


def stacked_linear(x, linears, split: bool = True):
    """[x W_1 + b_1, ..., x W_n + b_n] for n Linear layers that read the SAME input, computed as one
    matrix product x [W_1 ... W_n] + [b_1 ... b_n].      Shapes: x (..., in) -> n arrays (..., out_i)
    split=False returns the stacked output itself, (..., sum out_i), for the caller to cut.

    Self-attention projects one x to Q, K and V; cross-attention projects the memory to K and V. One GEMM
    n times as wide does the same FLOPs faster than n narrow ones: x is read once, and BLAS blocks and
    threads get more work per call. The weights stay separate Parameters; they are concatenated for the
    product, a (in, sum out_i) copy, small next to the activations. The outputs are views of one array.
    No cache: the caller keeps x for ``stacked_linear_backward``.
    """
    xp = backend.xp()
    x2d = x.reshape(-1, x.shape[-1])                                        # (N, in)
    W = xp.concatenate([lin.W.data for lin in linears], axis=1)             # (in, sum out_i)
    out = x2d @ W                                                           # (N, sum out_i)
    if any(lin.b is not None for lin in linears):
        # Speed: one add over the whole output (in place: `out` is ours) instead of n adds into strided
        # column slices (5% of this function on the base model). A layer without bias adds zeros.
        out += xp.concatenate([lin.b.data if lin.b is not None else xp.zeros(lin.out_features, out.dtype)
                               for lin in linears])                         # (sum out_i,)
    if not split:
        return out.reshape(*x.shape[:-1], out.shape[-1])                    # (..., sum out_i)
    outs, start = [], 0
    for lin in linears:
        part = out[:, start:start + lin.out_features]                       # (N, out_i), a view
        outs.append(part.reshape(*x.shape[:-1], lin.out_features))          # (..., out_i)
        start += lin.out_features
    return outs


def stacked_linear_backward(x, linears, dout):
    """Backward of ``stacked_linear``, given the gradient of the stacked output [out_1 ... out_n].
                                            Shapes: x (..., in), dout (..., sum out_i) -> n arrays (..., in)
    Adds dW_i and db_i into each layer's .grad (all dW_i from one product x^T dout, all db_i from one sum
    over the positions) and returns each input gradient dx_i = dout_i W_i^T separately (their sum, when
    the input was one x, is the caller's).
    """
    x2d = x.reshape(-1, x.shape[-1])                                        # (N, in)
    dout2d = dout.reshape(x2d.shape[0], dout.shape[-1])                     # (N, sum out_i); N may be 0
    dW = x2d.T @ dout2d                                                     # (in, sum out_i)
    db = dout2d.sum(axis=0) if any(lin.b is not None for lin in linears) else None  # (sum out_i,)
    dxs, start = [], 0
    for lin in linears:
        cols = slice(start, start + lin.out_features)
        lin.W.grad += dW[:, cols]                                           # dW_i = x^T dout_i   (in, out_i)
        if lin.b is not None:
            lin.b.grad += db[cols]                                          # db_i = sum_n dout_i (out_i,)
        dxs.append((dout2d[:, cols] @ lin.W.data.T).reshape(x.shape))      # dx_i = dout_i W_i^T (..., in)
        start += lin.out_features
    return dxs
