"""The two masks of the Transformer. True = this key may be attended.

Both broadcast against attention scores (B, H, Tq, Tk); combine them with ``&``.
"""

from __future__ import annotations

import numpy

from . import backend
from .layers._checks import check_positive_int


def padding_mask(ids, pad_id: int = 0):
    """True where the key token is not padding.          Shapes: ids (B,Tk) int -> (B,1,1,Tk) bool"""
    if not hasattr(ids, "ndim") or not hasattr(ids, "dtype"):
        raise TypeError(f"padding_mask: ids must be a 2-D integer array (B, T) of token ids, got {type(ids).__name__}")
    if ids.ndim != 2:
        raise ValueError(f"padding_mask: ids must be a 2-D array (B, T) of token ids, got shape {tuple(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"padding_mask: ids must hold integer token ids, got dtype {ids.dtype}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, numpy.integer)):
        raise TypeError(f"padding_mask: pad_id must be an int, got {pad_id!r}")
    # On the active backend, as subsequent_mask is: host ids (NumPy) give a device mask on CuPy, where a
    # host mask could neither be combined with ``&`` nor meet the scores. A no-op for NumPy and device ids.
    return (backend.asarray(ids) != pad_id)[:, None, None, :]  # (B,1,1,Tk)


def subsequent_mask(T: int):
    """True where key position j <= query position i: the decoder cannot look ahead.
                                                                     Shapes: -> (1,1,T,T) bool
    Row i of the lower triangle (diagonal included) lets position i see positions 0..i.
    """
    check_positive_int("subsequent_mask", "T", T)
    xp = backend.xp()
    return xp.tril(xp.ones((T, T), dtype=bool))[None, None]   # (1,1,T,T)
