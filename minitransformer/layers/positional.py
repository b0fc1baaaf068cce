"""Position information added to the embeddings: sinusoidal (the paper's §3.5) or learned."""

from __future__ import annotations

import numpy

from .. import backend, checks
from ..module import Module, Parameter


def sinusoidal_table(max_len: int, d_model: int) -> numpy.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    Computed in float64 on the host.                                        Returns (max_len, D)"""
    pos = numpy.arange(max_len, dtype=numpy.float64)[:, None]              # (L, 1)
    two_i = numpy.arange(0, d_model, 2, dtype=numpy.float64)[None, :]      # (1, D/2)
    angle = pos / numpy.power(10000.0, two_i / d_model)                    # (L, D/2)
    pe = numpy.empty((max_len, d_model), dtype=numpy.float64)              # (L, D)
    pe[:, 0::2] = numpy.sin(angle)
    pe[:, 1::2] = numpy.cos(angle)
    return pe


def check_positions(owner: str, x, offset, d_model: int, max_len: int) -> None:
    """x (B,T,D) and positions offset..offset+T-1 that the table has."""
    checks.float_array(owner, "x", x, ndim=3, last_dim=d_model)
    offset, T = checks.integer(owner, "offset", offset), x.shape[1]
    if offset < 0 or offset + T > max_len:
        raise ValueError(f"{owner}: the positions of x must be within max_len={max_len}, "
                         f"got positions {offset}..{offset + T - 1} (length {T}, offset {offset})")


class PositionalEncoding(Module):
    """out = x + PE[offset : offset+T], the fixed sinusoids of the paper.       Shapes: (B,T,D) -> (B,T,D)

    No parameters, so backward passes the gradient straight through: d(x + PE)/dx = I.
    ``offset`` is the position of the first row, used when decoding one token at a time.
    """

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        self.d_model = checks.positive_int("PositionalEncoding", "d_model", d_model)
        self.max_len = checks.positive_int("PositionalEncoding", "max_len", max_len)
        if d_model % 2:
            raise ValueError(f"PositionalEncoding: d_model must be even (sin/cos pairs), got {d_model}")
        self.pe = backend.asarray(sinusoidal_table(max_len, d_model), dtype=backend.get_default_dtype())  # (L, D)

    def check_inputs(self, x, offset=0):
        check_positions("PositionalEncoding", x, offset, self.d_model, self.max_len)

    def forward(self, x, offset: int = 0):                     # x (B,T,D)
        out = x + self.pe[offset:offset + x.shape[1]]          # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        self.saved(dout)
        return dout                                            # d(x + PE)/dx = I

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEmbedding(Module):
    """out = x + P[offset : offset+T], with P a learned table.                  Shapes: (B,T,D) -> (B,T,D)
    Cache: which rows of P were used (they receive the gradient, summed over the batch)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = checks.positive_int("LearnedPositionalEmbedding", "max_len", max_len)
        self.d_model = checks.positive_int("LearnedPositionalEmbedding", "d_model", d_model)
        self.P = Parameter(backend.host_rng().normal(0.0, d_model**-0.5, size=(max_len, d_model)))  # (L, D)

    def check_inputs(self, x, offset=0):
        check_positions("LearnedPositionalEmbedding", x, offset, self.d_model, self.max_len)

    def forward(self, x, offset: int = 0):                     # x (B,T,D)
        rows = slice(offset, offset + x.shape[1])
        out = x + self.P.data[rows]                            # (B,T,D)
        self.save_for_backward(out, rows=rows)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        rows = self.saved(dout).rows
        self.P.grad[rows] += dout.sum(axis=0)                  # dP = sum over the batch of dout   (T,D)
        return dout

    def extra_repr(self):
        return f"max_len={self.max_len}, d_model={self.d_model}"
