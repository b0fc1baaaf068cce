"""An Elman recurrent layer, the sequential alternative to self-attention in the paper's Table 1."""

from __future__ import annotations

from .. import backend, checks
from ..module import Module, Parameter
from .linear import xavier_uniform


class RNN(Module):
    """h_t = tanh(x_t W_x + h_{t-1} W_h + b), h_0 = 0; the output is every h_t.   Shapes: (B,T,D) -> (B,T,D)
    T sequential steps, each depending on the last: Table 1's O(n) sequential operations and path length.
    Backward is backpropagation through time: the steps in reverse, the gradient reaching h_{t-1} both from the
    output at t-1 and through W_h from step t.   Cache: x and every h_t."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = checks.positive_int("RNN", "d_model", d_model)
        self.W_x = Parameter(xavier_uniform(d_model, d_model))           # (D, D)
        self.W_h = Parameter(xavier_uniform(d_model, d_model))           # (D, D)
        self.b = Parameter(backend.xp().zeros(d_model))                  # (D,)

    def check_inputs(self, x):
        checks.float_array("RNN", "x", x, ndim=3, last_dim=self.d_model)

    def forward(self, x):                                      # x (B,T,D)
        xp = backend.xp()
        B, T, D = x.shape
        h = xp.zeros((B, T, D), dtype=x.dtype)                 # (B,T,D)
        h_prev = xp.zeros((B, D), dtype=x.dtype)               # h_0 (B,D)
        for t in range(T):
            h[:, t] = xp.tanh(x[:, t] @ self.W_x.data + h_prev @ self.W_h.data + self.b.data)   # (B,D)
            h_prev = h[:, t]
        self.save_for_backward(h, x=x, h=h)
        return h

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        xp = backend.xp()
        c = self.saved(dout)
        B, T, D = c.x.shape
        dx = xp.zeros_like(c.x)                                # (B,T,D)
        dh_next = xp.zeros((B, D), dtype=dout.dtype)           # the gradient h_t receives from step t+1
        for t in reversed(range(T)):
            dh = dout[:, t] + dh_next                          # from the output at t, and from step t+1   (B,D)
            dpre = dh * (1.0 - c.h[:, t] ** 2)                 # through tanh   (B,D)
            h_prev = c.h[:, t - 1] if t > 0 else xp.zeros((B, D), dtype=dout.dtype)
            self.W_x.grad += c.x[:, t].T @ dpre                # (D,D)
            self.W_h.grad += h_prev.T @ dpre                   # (D,D)
            self.b.grad += dpre.sum(axis=0)                    # (D,)
            dx[:, t] = dpre @ self.W_x.data.T                  # (B,D)
            dh_next = dpre @ self.W_h.data.T                   # to h_{t-1}   (B,D)
        return dx

    def extra_repr(self):
        return f"d_model={self.d_model}"
