"""Inverted dropout (Srivastava et al., 2014), as the paper applies it (§5.4)."""

from __future__ import annotations

from .. import backend
from ..module import Module
from ._checks import check_float_array, check_probability


class Dropout(Module):
    """out = x * m / (1 - p), m ~ Bernoulli(1 - p) per element; the identity in eval mode.
                                                                            Shapes: (...) -> (...)
    Scaling by 1/(1-p) during training keeps E[out] = x (to within the rounding of p, below), so nothing
    changes at inference.
    The mask is drawn with ``backend.device_rng()`` (through ``backend.random_uint16``): ``mt.manual_seed``
    makes it reproducible. It comes from 16-bit random integers, so the drop rate is p rounded to a
    multiple of 1/65536 (see forward).
    Cache: the scaled mask m / (1 - p), the whole derivative: dx = dout * m / (1 - p).

    inplace=True writes the result into the array it is given: forward overwrites x with the dropped-out x
    and backward overwrites dout with dx. Only for arrays no one else holds (PositionwiseFeedForward's hidden
    activations and their gradient); the default leaves both untouched.
    """

    def __init__(self, p: float = 0.1, inplace: bool = False):
        super().__init__()
        check_probability("Dropout", "p", p)
        self.p = float(p)
        self.inplace = bool(inplace)
        self.threshold = round(self.p * (1 << 16))             # drop where a 16-bit random integer < threshold
        self.scaled_mask = None

    def forward(self, x):
        check_float_array("Dropout", "x", x)
        if not self.training or self.p == 0.0:
            self.scaled_mask = None
            return x
        xp = backend.xp()
        # Speed: the mask comes from 16-bit random integers, several times cheaper to draw than floats on the
        # CPU (see backend.random_uint16; dropout draws ~47 M numbers a step on the base model). An element
        # is dropped when its integer r is below round(p * 65536): the drop rate is p to within 2^-17
        # (0.1 -> 0.1000061).
        r = backend.random_uint16(x.shape)                                              # r ~ U{0..65535}  (...)
        keep = r >= self.threshold                                                      # m, bool (...)
        self.scaled_mask = xp.multiply(keep, x.dtype.type(1.0 / (1.0 - self.p)))       # m / (1-p)  (...)
        return xp.multiply(x, self.scaled_mask, out=x if self.inplace else None)      # x * m / (1-p)  (...)

    def backward(self, dout):
        if self.scaled_mask is None:
            return dout
        dx = backend.xp().multiply(dout, self.scaled_mask, out=dout if self.inplace else None)  # dout * m / (1-p)
        self.scaled_mask = None
        return dx

    def extra_repr(self):
        return f"p={self.p}, inplace=True" if self.inplace else f"p={self.p}"
