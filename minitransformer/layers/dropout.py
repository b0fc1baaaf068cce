"""Inverted dropout (Srivastava et al., 2014), as the paper applies it (§5.4)."""

from __future__ import annotations

from .. import backend, checks
from ..module import Module


class Dropout(Module):
    """out = x * m / (1 - p), m ~ Bernoulli(1 - p) per element; the identity in eval mode.
                                                                            Shapes: (...) -> (...)
    Scaling by 1/(1-p) during training keeps E[out] = x, so nothing changes at inference.
    The mask is drawn with ``backend.device_rng()``: ``mt.manual_seed`` makes it reproducible.
    Cache: the scaled mask m / (1 - p), the whole derivative: dx = dout * m / (1 - p).
    """

    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = checks.fraction("Dropout", "p", p)

    def check_inputs(self, x):
        checks.float_array("Dropout", "x", x)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            self.save_for_backward(x, scaled_mask=None)
            return x
        keep = backend.device_rng().random(x.shape) >= self.p  # m: each element kept with probability 1 - p
        scaled_mask = keep.astype(x.dtype) / (1.0 - self.p)    # m / (1 - p)       (...)
        out = x * scaled_mask                                  # (...)
        self.save_for_backward(out, scaled_mask=scaled_mask)
        return out

    def backward(self, dout):
        scaled_mask = self.saved(dout).scaled_mask
        return dout if scaled_mask is None else dout * scaled_mask   # dx = dout * m / (1 - p)

    def extra_repr(self):
        return f"p={self.p}"
