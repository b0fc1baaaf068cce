"""The two masks of the Transformer. True = this key may be attended.

Both broadcast against attention scores (B, H, Tq, Tk); combine them with ``&``.
"""

from __future__ import annotations

from . import backend


def padding_mask(ids, pad_id: int = 0):
    """True where the key token is not padding.          Shapes: ids (B,Tk) int -> (B,1,1,Tk) bool"""
    if not hasattr(ids, "ndim") or ids.ndim != 2:
        raise ValueError(f"padding_mask: ids must be a 2-D array (B, T) of token ids, "
                         f"got {getattr(ids, 'shape', type(ids).__name__)}")
    return (ids != pad_id)[:, None, None, :]                  # (B,1,1,Tk)


def subsequent_mask(T: int):
    """True where key position j <= query position i: the decoder cannot look ahead.
                                                                     Shapes: -> (1,1,T,T) bool
    Row i of the lower triangle (diagonal included) lets position i see positions 0..i.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T <= 0:
        raise ValueError(f"subsequent_mask: T must be a positive int, got {T!r}")
    xp = backend.xp()
    return xp.tril(xp.ones((T, T), dtype=bool))[None, None]   # (1,1,T,T)
