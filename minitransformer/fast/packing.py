"""Packing: the real (non-pad) tokens of a padded batch, as rows, so that position-wise layers skip padding."""

from __future__ import annotations

import numpy

from .. import backend, checks


class Packing:
    """The real (non-pad) tokens of a padded (B,T) batch, as rows: every position-wise layer skips the padding.

    Most of a Transformer works on each position by itself: the Linear projections, the feed-forward
    network, LayerNorm, dropout and the residual sums. Only attention mixes positions, and it never lets
    a real token read a padded one (the padding mask). So nothing a real token computes depends on the
    padded positions, and their own outputs go nowhere (the loss ignores them). The fast model therefore
    runs its position-wise layers on the N real tokens alone, an (N, D) array of rows, and spreads the rows
    back into the (B, T) grid only for the attention scores, which need it. With 15-20% padding (a typical
    batch) that is 15-20% less work; the loss and every gradient are the same.

        pack(x)       (B,T,...) -> (N,...)    the rows of the real tokens, in reading order
        unpack(rows)  (N,...)   -> (B,T,...)  the grid back, with zeros at the padded positions

    Each is the other's backward: unpack sends a gradient back where pack took it, and the padded
    positions' gradient is 0. A batch without padding packs as a reshape (a view, no copy).
    ``index`` (N,) holds the flat positions b * T + t of the real tokens (None when there is no padding).
    Built on the host from host ids (NumPy), so a GPU step copies only ids to the device, never back.
    """

    def __init__(self, ids, pad_id: int = 0):
        if not hasattr(ids, "ndim") or ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ValueError(f"Packing: ids must be a 2-D integer array (B, T) of token ids, "
                             f"got {getattr(ids, 'shape', type(ids).__name__)}")
        checks.integer("Packing", "pad_id", pad_id)
        xp = numpy if isinstance(ids, numpy.ndarray) else backend.xp()   # device ids: counted there; int() syncs
        self.shape = tuple(int(n) for n in ids.shape)                  # (B, T)
        real = ids.reshape(-1) != pad_id                                # (B*T,) bool
        self.size = int(real.sum())                                     # N
        self.index = self.padding = None
        if self.size < ids.size:
            self.index = backend.asarray(xp.flatnonzero(real))          # (N,) b * T + t of each real token
            self.padding = backend.asarray(xp.flatnonzero(~real))      # (B*T - N,) the padded positions

    def pack(self, x):                                         # (B,T,...) -> (N,...)
        rows = x.reshape(-1, *x.shape[2:])                     # (B*T, ...)
        return rows if self.index is None else backend.xp().take(rows, self.index, axis=0)  # rows[index]

    def unpack(self, rows):                                    # (N,...) -> (B,T,...)
        if self.index is not None:
            grid = backend.xp().empty((self.shape[0] * self.shape[1], *rows.shape[1:]), dtype=rows.dtype)
            grid[self.index] = rows                            # (B*T, ...) the real tokens' rows
            grid[self.padding] = 0                             # and zeros: each element written once
            rows = grid
        return rows.reshape(*self.shape, *rows.shape[1:])

    def __repr__(self):
        return f"Packing({self.size} real tokens of a {self.shape[0]}x{self.shape[1]} batch)"


def pack(packing, x):                                          # (B,T,...) -> (N,...), or x itself without packing
    return x if packing is None else packing.pack(x)


def unpack(packing, rows):                                     # (N,...) -> (B,T,...), or rows itself without packing
    return rows if packing is None else packing.unpack(rows)
