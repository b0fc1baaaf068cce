"""A 1-D convolution over positions, the convolutional alternative to self-attention in the paper's Table 1."""

from __future__ import annotations

import math

from .. import backend, checks
from ..module import Module, Parameter


class Conv1d(Module):
    """out_t = b + sum_{j=0}^{k-1} x_{t+j-k//2} W_j, "same" padding (zeros outside).   Shapes: (B,T,D) -> (B,T,D)
    Each output sees k neighbouring positions, so a path between positions n apart needs about n/(k-1)*2 stacked
    layers (Table 1's O(n/k) for contiguous kernels). kernel_size is odd: position t sits mid-window.
    Cache: the zero-padded input."""

    def __init__(self, d_model: int, kernel_size: int):
        super().__init__()
        self.d_model = checks.positive_int("Conv1d", "d_model", d_model)
        self.kernel_size = checks.positive_int("Conv1d", "kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"Conv1d: kernel_size must be odd (same padding), got {kernel_size}")
        a = math.sqrt(6.0 / (2 * kernel_size * d_model))      # Glorot over the k*D inputs of each output
        self.W = Parameter(backend.host_rng().uniform(-a, a, size=(kernel_size, d_model, d_model)))  # (k,D,D)
        self.b = Parameter(backend.xp().zeros(d_model))        # (D,)

    def check_inputs(self, x):
        checks.float_array("Conv1d", "x", x, ndim=3, last_dim=self.d_model)

    def forward(self, x):                                      # x (B,T,D)
        T, p = x.shape[1], self.kernel_size // 2
        x_pad = backend.xp().pad(x, ((0, 0), (p, p), (0, 0)))  # zeros at both ends   (B,T+2p,D)
        out = self.b.data + sum(x_pad[:, j:j + T] @ self.W.data[j] for j in range(self.kernel_size))  # (B,T,D)
        self.save_for_backward(out, x_pad=x_pad)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        x_pad = self.saved(dout).x_pad
        T, p, D = dout.shape[1], self.kernel_size // 2, self.d_model
        dx_pad = backend.xp().zeros_like(x_pad)                # (B,T+2p,D)
        for j in range(self.kernel_size):
            self.W.grad[j] += x_pad[:, j:j + T].reshape(-1, D).T @ dout.reshape(-1, D)   # (D,D)
            dx_pad[:, j:j + T] += dout @ self.W.data[j].T      # every window that read this position
        self.b.grad += dout.reshape(-1, D).sum(axis=0)         # (D,)
        return dx_pad[:, p:p + T]                              # the padding has no input to pass it to

    def extra_repr(self):
        return f"d_model={self.d_model}, kernel_size={self.kernel_size}"
