"""Attention: the Mask layer, scaled dot-product attention (§3.2.1) and multi-head attention (§3.2.2)."""

from __future__ import annotations

import math

from .. import backend
from ..masks import Packing
from ..module import Module
from ._checks import (
    check_float_array,
    check_mask,
    check_positive_int,
    check_probability,
)
from .activations import Softmax
from .dropout import Dropout
from .linear import Linear, stacked_linear, stacked_linear_backward

# Added where the mask is False. Large and finite: exp(MASKED - max) underflows to exactly 0 in float32
# and float64, while -inf would turn a row with every key masked into NaN (inf - inf).
MASKED = -1e9


class Mask(Module):
    """out = scores where mask is True, MASKED (a large negative) where it is False.
                                                  Shapes: scores (B,H,Tq,Tk), mask broadcastable -> (B,H,Tq,Tk)
    A masked score no longer depends on its input, so backward zeroes the gradient there.
    Cache: the mask.
    """

    def forward(self, scores, mask):
        xp = backend.xp()
        check_mask("Mask", mask, scores.shape)
        self.mask = mask
        return xp.where(mask, scores, scores.dtype.type(MASKED))  # (B,H,Tq,Tk)

    def backward(self, dout):
        dscores = backend.xp().where(self.mask, dout, dout.dtype.type(0))  # (B,H,Tq,Tk)
        self.mask = None
        return dscores


class ScaledDotProductAttention(Module):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, each step a layer of its own:
    matmul -> scale -> Mask -> Softmax -> Dropout -> matmul.

    Shapes: q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv), mask broadcastable to (B,H,Tq,Tk) -> (B,H,Tq,Dv)
    ``.attn`` keeps the weights (B,H,Tq,Tk) after softmax, before dropout, for plots.
    A query row whose keys are all masked gets zero weights (and a zero output) instead of a uniform
    average over padding.
    Cache: q, k, v, the weights after dropout, the scale 1/sqrt(d_k), whether a mask was given and which
    query rows had every key masked (their gradient is zero), and the children's caches.
    """

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.mask_layer = Mask()
        self.softmax = Softmax(axis=-1)
        self.dropout = Dropout(dropout)
        self.attn = None

    def forward(self, q, k, v, mask=None):
        xp = backend.xp()
        self._check_inputs(q, k, v)
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        scores = q @ k.swapaxes(-1, -2)                        # Q K^T   (B,H,Tq,Tk)
        scores *= self.scale                                   # / sqrt(d_k), in place: scores is ours
        if mask is not None:
            scores = self.mask_layer(scores, mask)             # (B,H,Tq,Tk)
        attn = self.softmax(scores)                            # (B,H,Tq,Tk), rows sum to 1
        self.empty_rows = None
        if mask is not None:
            self.empty_rows = ~mask.any(axis=-1, keepdims=True)  # (B|1,1|H,Tq|1,1) rows with no key at all
            attn = xp.where(self.empty_rows, attn.dtype.type(0), attn)
        self.attn = attn
        self.attn_dropped = self.dropout(attn)                 # (B,H,Tq,Tk)
        self.q, self.k, self.v = q, k, v
        self.has_mask = mask is not None
        return self.attn_dropped @ v                           # (B,H,Tq,Dv)

    @staticmethod
    def _check_inputs(q, k, v):
        for name, x in (("q", q), ("k", k), ("v", v)):
            check_float_array("ScaledDotProductAttention", name, x)
            if x.ndim < 2 or x.shape[:-2] != q.shape[:-2]:
                raise ValueError(f"ScaledDotProductAttention: q, k and v must have shapes (..., T, d) with the same "
                                 f"leading axes, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise ValueError(f"ScaledDotProductAttention: q and k must share the last axis (Dk) and k and v the "
                             f"key axis (Tk): q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv), "
                             f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")

    def backward(self, dout):                                  # dout (B,H,Tq,Dv)
        xp = backend.xp()
        q, k, v = self.q, self.k, self.v
        dv = self.attn_dropped.swapaxes(-1, -2) @ dout         # (B,H,Tk,Dv)
        dattn = self.dropout.backward(dout @ v.swapaxes(-1, -2))  # (B,H,Tq,Tk)
        if self.empty_rows is not None:
            dattn = xp.where(self.empty_rows, dattn.dtype.type(0), dattn)
        dscores = self.softmax.backward(dattn)                 # (B,H,Tq,Tk)
        if self.has_mask:
            dscores = self.mask_layer.backward(dscores)
        dscores *= self.scale                                  # in place: dscores is a fresh array
        dq = dscores @ k                                       # (B,H,Tq,Dk)
        dk = dscores.swapaxes(-1, -2) @ q                      # (B,H,Tk,Dk)
        self.q = self.k = self.v = self.attn_dropped = None
        return dq, dk, dv


class MultiHeadAttention(Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W_o,  head_i = Attention(Q W_q^i, K W_k^i, V W_v^i).

    Query, key and value are separate inputs, so one class serves self-attention (all three are x)
    and the decoder's cross-attention (key = value = encoder output).
    Shapes: query (B,Tq,D), key (B,Tk,D), value (B,Tk,D), mask broadcastable to (B,H,Tq,Tk) -> (B,Tq,D)
    backward(dout) -> (dquery, dkey, dvalue); for self-attention the caller adds the three.
    ``.attn`` -> (B,H,Tq,Tk) after forward.

    packing=(query_packing, key_packing) (``masks.Packing``, either may be None): that side comes as
    the rows of its real tokens only, query (Nq,D) and key, value (Nk,D), and the output is (Nq,D).
    The projections run on those rows; Q, K and V are unpacked into their (B,T) grids for the heads,
    and the heads' output is packed again before W_o. Padded positions hold zeros in the grids, and the
    mask must hide the padded keys (it does for the Transformer's masks).
    Cache: held by the projections and the attention core; ``stacked`` holds the shared input of the
    projections that ran as one matmul (x for Q, K, V in self-attention; the memory for K, V in cross);
    ``packing`` the forward's packing.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        check_positive_int("MultiHeadAttention", "d_model", d_model)
        check_positive_int("MultiHeadAttention", "num_heads", num_heads)
        check_probability("MultiHeadAttention", "dropout", dropout)
        if d_model % num_heads:
            raise ValueError(f"MultiHeadAttention: d_model must be divisible by num_heads, "
                             f"got d_model={d_model}, num_heads={num_heads}")
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.W_q = Linear(d_model, d_model)
        self.W_k = Linear(d_model, d_model)
        self.W_v = Linear(d_model, d_model)
        self.attention = ScaledDotProductAttention(dropout)
        self.W_o = Linear(d_model, d_model)
        self.stacked = None
        self.packing = (None, None)

    @property
    def attn(self):
        return self.attention.attn

    def split_heads(self, x):                                  # (B,T,D) -> (B,H,T,Dk)
        B, T, _ = x.shape
        return x.reshape(B, T, self.num_heads, self.d_k).transpose(0, 2, 1, 3)

    def merge_heads(self, x):                                  # (B,H,T,Dk) -> (B,T,D)
        B, _, T, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, self.d_model)

    def _check_inputs(self, query, key, value, mask, packing):
        # All before the first projection runs: a failed call must not leave W_q waiting for a backward.
        if not isinstance(packing, tuple) or len(packing) != 2 or \
                not all(p is None or isinstance(p, Packing) for p in packing):
            raise TypeError(f"MultiHeadAttention: packing must be a pair (query's, key's) of masks.Packing or "
                            f"None, got {packing!r}")
        grids = []                                             # (B, T) of query, key, value
        for name, x, rows in (("query", query, packing[0]), ("key", key, packing[1]), ("value", value, packing[1])):
            check_float_array("MultiHeadAttention", name, x)
            if rows is None and (x.ndim != 3 or x.shape[-1] != self.d_model):
                raise ValueError(f"MultiHeadAttention: {name} must have shape (B, T, d_model={self.d_model}), "
                                 f"got {tuple(x.shape)}")
            if rows is not None and tuple(x.shape) != (rows.size, self.d_model):
                raise ValueError(f"MultiHeadAttention: {name} is packed, so it must have shape (N={rows.size} "
                                 f"real tokens, d_model={self.d_model}), got {tuple(x.shape)}")
            grids.append(tuple(x.shape[:2]) if rows is None else rows.shape)
        if grids[1] != grids[2]:
            raise ValueError(f"MultiHeadAttention: key and value must have the same (B, Tk), "
                             f"got key {tuple(key.shape)} and value {tuple(value.shape)}")
        if grids[0][0] != grids[1][0]:
            raise ValueError(f"MultiHeadAttention: query and key must have the same batch size, "
                             f"got {grids[0][0]} and {grids[1][0]}")
        if mask is not None:
            check_mask("MultiHeadAttention", mask, (grids[0][0], self.num_heads, grids[0][1], grids[1][1]))

    def forward(self, query, key, value, mask=None, packing=(None, None)):
        self._check_inputs(query, key, value, mask, packing)
        self.packing = packing
        # Speed: projections that read the same array run as ONE wide matmul (see stacked_linear):
        # Q, K and V in self-attention (query is key is value), K and V in cross-attention (key is value).
        # Separate arrays go through W_q, W_k, W_v one by one. The arithmetic is the same either way.
        # Packed sides come as rows and go into their (B,T) grids right after the projections: each stacked
        # output is unpacked as one array (one scatter instead of two or three), then cut into views.
        D, (q_rows, k_rows) = self.d_model, packing
        if query is key and key is value:
            self.stacked = (query, (self.W_q, self.W_k, self.W_v))
            qkv = unpack(q_rows, stacked_linear(query, self.stacked[1], split=False))  # (B,Tq,3D)
            q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]            # (B,Tq,D) views
        elif key is value:
            self.stacked = (key, (self.W_k, self.W_v))
            q = unpack(q_rows, self.W_q(query))                # (B,Tq,D)
            kv = unpack(k_rows, stacked_linear(key, self.stacked[1], split=False))  # (B,Tk,2D)
            k, v = kv[..., :D], kv[..., D:]                    # (B,Tk,D) views
        else:
            self.stacked = None
            q, k, v = unpack(q_rows, self.W_q(query)), unpack(k_rows, self.W_k(key)), unpack(k_rows, self.W_v(value))
        heads = self.attention(self.split_heads(q), self.split_heads(k), self.split_heads(v), mask)  # (B,H,Tq,Dk)
        return self.W_o(pack(q_rows, self.merge_heads(heads)))  # Concat(heads) W_o   (B,Tq,D) or (Nq,D)

    def backward(self, dout):                                  # dout (B,Tq,D) or (Nq,D)
        q_rows, k_rows = self.packing
        self.packing = (None, None)
        dheads = self.split_heads(unpack(q_rows, self.W_o.backward(dout)))  # (B,H,Tq,Dk)
        dq, dk, dv = self.attention.backward(dheads)           # (B,H,Tq,Dk), (B,H,Tk,Dk), (B,H,Tk,Dk)
        if self.stacked is None:
            dquery = self.W_q.backward(pack(q_rows, self.merge_heads(dq)))   # (B,Tq,D) or (Nq,D)
            dkey = self.W_k.backward(pack(k_rows, self.merge_heads(dk)))     # (B,Tk,D) or (Nk,D)
            dvalue = self.W_v.backward(pack(k_rows, self.merge_heads(dv)))   # (B,Tk,D) or (Nk,D)
            return dquery, dkey, dvalue
        x, linears = self.stacked
        self.stacked = None
        if len(linears) == 3:                                  # self-attention: Q, K, V from one x
            dqkv = pack(q_rows, self.merge_heads_stacked(dq, dk, dv))       # (B,T,3D) or (N,3D)
            dquery, dkey, dvalue = stacked_linear_backward(x, linears, dqkv)
        else:                                                  # cross-attention: K, V from one memory
            dquery = self.W_q.backward(pack(q_rows, self.merge_heads(dq)))  # (B,Tq,D) or (Nq,D)
            dkey, dvalue = stacked_linear_backward(x, linears, pack(k_rows, self.merge_heads_stacked(dk, dv)))
        return dquery, dkey, dvalue

    def merge_heads_stacked(self, *xs):                        # n x (B,H,T,Dk) -> (B,T,n*D)
        """[merge_heads(x_1) ... merge_heads(x_n)] side by side, written in one pass (no concatenate)."""
        B, _, T, _ = xs[0].shape
        out = backend.xp().empty((B, T, len(xs), self.num_heads, self.d_k), dtype=xs[0].dtype)  # (B,T,n,H,Dk)
        for i, x in enumerate(xs):
            out[:, :, i] = x.transpose(0, 2, 1, 3)             # (B,T,H,Dk)
        return out.reshape(B, T, len(xs) * self.d_model)       # (B,T,n*D)

    def extra_repr(self):
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_k={self.d_k}"


def pack(packing, x):                                          # (B,T,...) -> (N,...), or x itself without packing
    return x if packing is None else packing.pack(x)


def unpack(packing, rows):                                     # (N,...) -> (B,T,...), or rows itself without packing
    return rows if packing is None else packing.unpack(rows)
