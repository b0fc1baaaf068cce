"""Layer normalisation (Ba et al., 2016) over the feature axis, identical to torch.nn.LayerNorm."""

from __future__ import annotations

from .. import backend
from ..module import Module, Parameter
from ._checks import check_last_dim, check_positive_int, check_positive_number


class LayerNorm(Module):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis.     Shapes: (..., D) -> (..., D)

    mean and the biased variance (divide by D, not D-1) are taken per position, across the D
    features; eps sits inside the square root. This is torch.nn.LayerNorm exactly (the Annotated
    Transformer's version, with the unbiased std and eps outside, is not).
    Cache: x_hat = (x - mean) * rstd and rstd = 1 / sqrt(var + eps): all backward needs.

    Backward (with g = dout * gamma, means over the last axis):
        dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
        dgamma = sum(dout * x_hat),  dbeta = sum(dout)   (summed over every position)
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        check_positive_int("LayerNorm", "d_model", d_model)
        check_positive_number("LayerNorm", "eps", eps)
        xp = backend.xp()
        self.d_model, self.eps = d_model, float(eps)
        self.gamma = Parameter(xp.ones(d_model, dtype=backend.get_default_dtype()))   # (D,)
        self.beta = Parameter(xp.zeros(d_model, dtype=backend.get_default_dtype()))   # (D,)

    def forward(self, x):                                      # x (..., D)
        check_last_dim("LayerNorm", "x", x, self.d_model)
        xp = backend.xp()
        mean = x.mean(axis=-1, keepdims=True)                  # (..., 1)
        centered = x - mean                                    # (..., D)
        out = centered * centered                              # (..., D) squares; the buffer becomes `out`
        var = out.mean(axis=-1, keepdims=True)                 # (..., 1) biased variance
        self.rstd = 1.0 / xp.sqrt(var + self.eps)              # (..., 1)
        # Speed: in place on arrays this call created (two allocations fewer; same arithmetic).
        centered *= self.rstd
        self.x_hat = centered                                  # (..., D)
        xp.multiply(self.x_hat, self.gamma.data, out=out)
        out += self.beta.data                                  # x_hat * gamma + beta  (..., D)
        return out

    def backward(self, dout):                                  # dout (..., D) -> dx (..., D)
        xp = backend.xp()
        x_hat, rstd = self.x_hat, self.rstd
        rows = dout.reshape(-1, self.d_model)                  # (N, D)
        work = dout * x_hat                                    # (..., D) a buffer of ours, reused below
        self.gamma.grad += work.reshape(-1, self.d_model).sum(axis=0)  # dgamma = sum dout * x_hat  (D,)
        self.beta.grad += rows.sum(axis=0)                     # dbeta = sum dout  (D,)
        g = dout * self.gamma.data                             # dL/dx_hat (..., D)
        # dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), evaluated in place in g and `work`
        # (speed: two (..., D) allocations instead of seven; same arithmetic).
        g_xhat_mean = xp.multiply(g, x_hat, out=work).mean(axis=-1, keepdims=True)  # (..., 1)
        g -= g.mean(axis=-1, keepdims=True)
        g -= xp.multiply(x_hat, g_xhat_mean, out=work)
        g *= rstd
        self.x_hat = self.rstd = None
        return g                                               # dx (..., D)

    def extra_repr(self):
        return f"d_model={self.d_model}, eps={self.eps}"
