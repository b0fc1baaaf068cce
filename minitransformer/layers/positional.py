"""Position information added to the embeddings: sinusoidal (the paper's §3.5) or learned."""

from __future__ import annotations

import numpy

from .. import backend
from ..module import Module, Parameter
from ._checks import check_last_dim, check_positive_int


def sinusoidal_table(max_len: int, d_model: int) -> numpy.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Computed in float64 on the host.                                        Returns (max_len, D)
    """
    pos = numpy.arange(max_len, dtype=numpy.float64)[:, None]              # (L, 1)
    two_i = numpy.arange(0, d_model, 2, dtype=numpy.float64)[None, :]      # (1, D/2)
    angle = pos / numpy.power(10000.0, two_i / d_model)                    # (L, D/2)
    pe = numpy.empty((max_len, d_model), dtype=numpy.float64)              # (L, D)
    pe[:, 0::2] = numpy.sin(angle)
    pe[:, 1::2] = numpy.cos(angle)
    return pe


def _check_length(owner: str, x, offset: int, max_len: int) -> int:
    """The length T of x (B,T,D), after checking that positions offset..offset+T-1 exist."""
    if x.ndim < 2:
        raise ValueError(f"{owner}: x must have shape (..., T, d_model), got shape {tuple(x.shape)}")
    T = x.shape[-2]
    if isinstance(offset, bool) or not isinstance(offset, (int, numpy.integer)):
        raise TypeError(f"{owner}: offset must be an int (the position of the first row), got {offset!r}")
    if offset < 0 or offset + T > max_len:
        raise ValueError(f"{owner}: the positions of x must be within max_len={max_len}, "
                         f"got positions {offset}..{offset + T - 1} (length {T}, offset {offset})")
    return T


class PositionalEncoding(Module):
    """out = x + PE[offset : offset+T], the fixed sinusoids of the paper.       Shapes: (B,T,D) -> (B,T,D)

    No parameters, so backward passes the gradient straight through: d(x + PE)/dx = I.
    ``offset`` is the position of the first row, used when decoding one token at a time.
    """

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        check_positive_int("PositionalEncoding", "d_model", d_model)
        check_positive_int("PositionalEncoding", "max_len", max_len)
        if d_model % 2:
            raise ValueError(f"PositionalEncoding: d_model must be even (sin/cos pairs), got {d_model}")
        self.d_model, self.max_len = d_model, max_len
        self.pe = backend.asarray(sinusoidal_table(max_len, d_model), dtype=backend.get_default_dtype())  # (L, D)

    def forward(self, x, offset: int = 0):                     # x (B,T,D)
        check_last_dim("PositionalEncoding", "x", x, self.d_model)
        T = _check_length("PositionalEncoding", x, offset, self.max_len)
        return x + self.pe[offset:offset + T]                  # (B,T,D)

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        return dout

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEmbedding(Module):
    """out = x + P[offset : offset+T], with P a learned table.                  Shapes: (B,T,D) -> (B,T,D)

    Cache: the offset and length, which rows of P received a gradient.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        check_positive_int("LearnedPositionalEmbedding", "max_len", max_len)
        check_positive_int("LearnedPositionalEmbedding", "d_model", d_model)
        self.d_model, self.max_len = d_model, max_len
        self.P = Parameter(backend.host_rng().normal(0.0, d_model**-0.5, size=(max_len, d_model)))  # (L, D)

    def forward(self, x, offset: int = 0):                     # x (B,T,D)
        check_last_dim("LearnedPositionalEmbedding", "x", x, self.d_model)
        T = _check_length("LearnedPositionalEmbedding", x, offset, self.max_len)
        self.rows = (offset, offset + T)
        return x + self.P.data[offset:offset + T]             # (B,T,D)

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        start, stop = self.rows
        self.P.grad[start:stop] += dout.reshape(-1, *dout.shape[-2:]).sum(axis=0)  # sum over the batch (T,D)
        return dout

    def extra_repr(self):
        return f"max_len={self.max_len}, d_model={self.d_model}"
