"""Layer normalisation (Ba et al., 2016) over the feature axis, identical to torch.nn.LayerNorm."""

from __future__ import annotations

from .. import backend, checks
from ..module import Module, Parameter


class LayerNorm(Module):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis.     Shapes: (..., D) -> (..., D)

    mean and the biased variance (divide by D, not D-1) are taken per position, across the D
    features; eps sits inside the square root. This is torch.nn.LayerNorm exactly (the Annotated
    Transformer's version, with the unbiased std and eps outside, is not).
    Cache: x_hat = (x - mean) * rstd and rstd = 1 / sqrt(var + eps): all backward needs.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.d_model = checks.positive_int("LayerNorm", "d_model", d_model)
        self.eps = checks.positive_number("LayerNorm", "eps", eps)
        xp = backend.xp()
        self.gamma = Parameter(xp.ones(d_model))               # (D,)
        self.beta = Parameter(xp.zeros(d_model))               # (D,)

    def check_inputs(self, x):
        checks.float_array("LayerNorm", "x", x, last_dim=self.d_model)

    def forward(self, x):                                      # x (..., D)
        mean = x.mean(axis=-1, keepdims=True)                  # (..., 1)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)   # (..., 1) biased variance
        rstd = 1.0 / backend.xp().sqrt(var + self.eps)         # (..., 1)
        x_hat = (x - mean) * rstd                              # (..., D) zero mean, unit variance
        out = x_hat * self.gamma.data + self.beta.data         # (..., D)
        self.save_for_backward(out, x_hat=x_hat, rstd=rstd)
        return out

    def backward(self, dout):                                  # dout (..., D) -> dx (..., D)
        cache = self.saved(dout)
        x_hat, rstd = cache.x_hat, cache.rstd                  # (..., D), (..., 1)
        self.gamma.grad += (dout * x_hat).reshape(-1, self.d_model).sum(axis=0)  # dgamma = sum dout * x_hat (D,)
        self.beta.grad += dout.reshape(-1, self.d_model).sum(axis=0)             # dbeta = sum dout          (D,)
        g = dout * self.gamma.data                             # dL/dx_hat  (..., D)
        # x_hat depends on x three ways: directly, through the mean and through the variance:
        term1 = g                                              # direct path
        term2 = g.mean(axis=-1, keepdims=True)                 # through the mean           (..., 1)
        term3 = x_hat * (g * x_hat).mean(axis=-1, keepdims=True)  # through the variance    (..., D)
        return rstd * (term1 - term2 - term3)                  # dx  (..., D)

    def extra_repr(self):
        return f"d_model={self.d_model}, eps={self.eps}"
