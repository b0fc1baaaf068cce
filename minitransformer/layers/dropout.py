"""Inverted dropout (Srivastava et al., 2014), as the paper applies it (§5.4)."""

from __future__ import annotations

from .. import backend
from ..module import Module
from ._checks import check_float_array, check_probability


class Dropout(Module):
    """out = x * m / (1 - p), m ~ Bernoulli(1 - p) per element; the identity in eval mode.
                                                                            Shapes: (...) -> (...)
    Scaling by 1/(1-p) during training keeps E[out] = x, so nothing changes at inference.
    The mask is drawn with ``backend.device_rng()``: ``mt.manual_seed`` makes it reproducible.
    Cache: the scaled mask m / (1 - p), the whole derivative: dx = dout * m / (1 - p).
    """

    def __init__(self, p: float = 0.1):
        super().__init__()
        check_probability("Dropout", "p", p)
        self.p = float(p)
        self.scaled_mask = None

    def forward(self, x):
        check_float_array("Dropout", "x", x)
        if not self.training or self.p == 0.0:
            self.scaled_mask = None
            return x
        u = backend.device_rng().random(x.shape, dtype=x.dtype)                # u ~ U[0, 1)  (...)
        keep = u >= self.p                                                      # m, bool (...)
        # Speed: m / (1-p) is written into the buffer of the draws (no longer needed) instead of two new
        # float arrays (astype, then the product); a float32 scalar keeps the product in float32.
        self.scaled_mask = backend.xp().multiply(keep, x.dtype.type(1.0 / (1.0 - self.p)), out=u)  # (...)
        return x * self.scaled_mask

    def backward(self, dout):
        if self.scaled_mask is None:
            return dout
        dx = dout * self.scaled_mask
        self.scaled_mask = None
        return dx

    def extra_repr(self):
        return f"p={self.p}"
