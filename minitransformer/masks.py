"""The masks of attention: True where a query may attend to a key.

They broadcast against attention scores (B, H, Tq, Tk); combine them with ``&``.
"""

from __future__ import annotations

from . import backend, checks


def padding_mask(ids, pad_id: int = 0):
    """True where the key token is not padding.          Shapes: ids (B,Tk) int -> (B,1,1,Tk) bool"""
    checks.integer("padding_mask", "pad_id", pad_id)
    if not hasattr(ids, "dtype") or ids.dtype.kind not in "iu":
        raise TypeError(f"padding_mask: ids must be an integer array (B, T) of token ids, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.ndim != 2:
        raise ValueError(f"padding_mask: ids must be a 2-D array (B, T) of token ids, got shape {tuple(ids.shape)}")
    # On the active backend: host ids (NumPy) give a device mask on CuPy, where it meets the scores.
    return (backend.asarray(ids) != pad_id)[:, None, None, :]  # (B,1,1,Tk)


def subsequent_mask(T: int):
    """True where key position j <= query position i: the decoder cannot look ahead.
                                                                     Shapes: -> (1,1,T,T) bool
    Row i of the lower triangle (diagonal included) lets position i see positions 0..i."""
    T = checks.positive_int("subsequent_mask", "T", T)
    xp = backend.xp()
    return xp.tril(xp.ones((T, T), dtype=bool))[None, None]   # (1,1,T,T)


def local_mask(T: int, r: int):
    """True where |i - j| <= r: restricted self-attention (§4), each position sees a window of 2r + 1.
                                                                     Shapes: -> (1,1,T,T) bool"""
    T = checks.positive_int("local_mask", "T", T)
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise ValueError(f"local_mask: r must be an int >= 0 (the window's radius), got {r!r}")
    xp = backend.xp()
    i = xp.arange(T)
    return (xp.abs(i[:, None] - i[None, :]) <= r)[None, None]  # (1,1,T,T)
