"""Attention: the Mask layer, scaled dot-product attention (§3.2.1) and multi-head attention (§3.2.2)."""

from __future__ import annotations

import math

from .. import backend, checks
from ..module import Module
from .activations import Softmax
from .dropout import Dropout
from .linear import Linear

# Put where the mask is False. Large and finite: exp(MASKED - max) underflows to exactly 0 in float32
# and float64, while -inf would turn a row with every key masked into NaN (inf - inf).
MASKED = -1e9


def check_qkv(owner: str, q, k, v, mask) -> None:
    """q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) float arrays, and a mask for their scores (..., Tq, Tk)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        checks.float_array(owner, name, x)
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or \
            k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{owner}: q, k and v must have shapes (..., Tq, Dk), (..., Tk, Dk) and (..., Tk, Dv), "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[-2] == 0:
        raise ValueError(f"{owner}: attention needs at least one key, got k of shape {tuple(k.shape)}")
    if mask is not None:
        checks.mask(owner, mask, (*q.shape[:-1], k.shape[-2]))


class Mask(Module):
    """out = scores where mask is True, MASKED (a large negative) where it is False.
                                                  Shapes: scores (B,H,Tq,Tk), mask broadcastable -> (B,H,Tq,Tk)
    A masked score no longer depends on its input, so backward zeroes the gradient there.
    Cache: the mask.
    """

    def check_inputs(self, scores, mask):
        checks.float_array("Mask", "scores", scores)
        checks.mask("Mask", mask, scores.shape)

    def forward(self, scores, mask):
        out = backend.xp().where(mask, scores, scores.dtype.type(MASKED))   # (B,H,Tq,Tk)
        self.save_for_backward(out, mask=mask)
        return out

    def backward(self, dout):
        mask = self.saved(dout).mask
        return dout * mask                                     # 0 where masked   (B,H,Tq,Tk)


class ScaledDotProductAttention(Module):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, each step a layer of its own:
    matmul -> scale -> Mask -> Softmax -> Dropout -> matmul.
                Shapes: q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv), mask broadcastable to (B,H,Tq,Tk) -> (B,H,Tq,Dv)

    scale=False leaves out the 1/sqrt(d_k), for the paper's comparison (§3.2.1).
    ``.attn`` keeps the weights (B,H,Tq,Tk) after softmax, before dropout, for plots; ``.dattn`` keeps dL/dA, their
    gradient, after backward, for the viewer's gradient view.
    A query row whose keys are all masked gets zero weights (and a zero output), not a uniform average
    over padding.
    Cache: q, k, v, the weights after dropout, which query rows have a key, and the children's caches.
    """

    def __init__(self, dropout: float = 0.0, scale: bool = True):
        super().__init__()
        self.scale = checks.boolean("ScaledDotProductAttention", "scale", scale)
        self.mask_layer = Mask()
        self.softmax = Softmax(axis=-1)
        self.dropout = Dropout(dropout)
        self.attn = self.dattn = None

    def check_inputs(self, q, k, v, mask=None):
        check_qkv("ScaledDotProductAttention", q, k, v, mask)

    def forward(self, q, k, v, mask=None):
        scale = 1.0 / math.sqrt(q.shape[-1]) if self.scale else 1.0
        scores = (q @ k.swapaxes(-1, -2)) * scale              # S = Q K^T / sqrt(d_k)   (B,H,Tq,Tk)
        has_key = None
        if mask is not None:
            scores = self.mask_layer.forward(scores, mask)     # (B,H,Tq,Tk)
            has_key = mask.any(axis=-1, keepdims=True)         # (B,1,Tq|1,1) False: every key of the row is masked
        attn = self.softmax.forward(scores)                    # A = softmax(S), rows sum to 1   (B,H,Tq,Tk)
        if has_key is not None:
            attn = attn * has_key                              # a row with no key at all: zero weights
        self.attn = attn
        attn_dropped = self.dropout.forward(attn)              # (B,H,Tq,Tk)
        out = attn_dropped @ v                                 # A V   (B,H,Tq,Dv)
        self.save_for_backward(out, q=q, k=k, v=v, attn_dropped=attn_dropped, scale=scale, has_key=has_key)
        return out

    def backward(self, dout):                                  # dout (B,H,Tq,Dv); forward's steps in reverse
        c = self.saved(dout)
        dv = c.attn_dropped.swapaxes(-1, -2) @ dout            # out = A V:  dV = A^T dout          (B,H,Tk,Dv)
        dattn = self.dropout.backward(dout @ c.v.swapaxes(-1, -2))  # dA = dout V^T, through dropout  (B,H,Tq,Tk)
        self.dattn = dattn
        if c.has_key is not None:
            dattn = dattn * c.has_key                          # rows with no key had constant zero weights
        dscores = self.softmax.backward(dattn)                 # through softmax                    (B,H,Tq,Tk)
        if c.has_key is not None:
            dscores = self.mask_layer.backward(dscores)        # masked scores were constants: 0 there
        dscores = dscores * c.scale                            # through the 1/sqrt(d_k)
        dq = dscores @ c.k                                     # S = Q K^T:  dQ = dS K              (B,H,Tq,Dk)
        dk = dscores.swapaxes(-1, -2) @ c.q                    #             dK = dS^T Q            (B,H,Tk,Dk)
        return dq, dk, dv

    def extra_repr(self):
        return "" if self.scale else "scale=False"


class MultiHeadAttention(Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W_o,  head_i = Attention(Q W_q^i, K W_k^i, V W_v^i),
    W_q^i, W_k^i in R^(D x Dk), W_v^i in R^(D x Dv), W_o in R^(H*Dv x D).

    Query, key and value are separate inputs, so one class serves self-attention (all three are x)
    and the decoder's cross-attention (key = value = encoder output).
    Shapes: query (B,Tq,D), key (B,Tk,D), value (B,Tk,D), mask broadcastable to (B,H,Tq,Tk) -> (B,Tq,D)
    backward(dout) -> (dquery, dkey, dvalue); for self-attention the caller adds the three.
    ``.attn`` -> (B,H,Tq,Tk) after forward.
    d_k, the size of each head's queries and keys, is d_model / num_heads unless given; d_v, the size of its
    values (and so of its output), is d_k unless given. The paper takes d_k = d_v = D / H; its Table 3 varies
    d_k alone (row B) and both together (row A).
    Cache: held by the projections and the attention core.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, d_k: int | None = None,
                 d_v: int | None = None):
        super().__init__()
        self.d_model = checks.positive_int("MultiHeadAttention", "d_model", d_model)
        self.num_heads = checks.positive_int("MultiHeadAttention", "num_heads", num_heads)
        if d_k is None and d_model % num_heads:
            raise ValueError(f"MultiHeadAttention: d_model must be divisible by num_heads (or give d_k), "
                             f"got d_model={d_model}, num_heads={num_heads}")
        self.d_k = d_model // num_heads if d_k is None else checks.positive_int("MultiHeadAttention", "d_k", d_k)
        self.d_v = self.d_k if d_v is None else checks.positive_int("MultiHeadAttention", "d_v", d_v)
        self.W_q = Linear(d_model, num_heads * self.d_k)       # the H matrices W_q^i side by side   (D, H*Dk)
        self.W_k = Linear(d_model, num_heads * self.d_k)       # (D, H*Dk)
        self.W_v = Linear(d_model, num_heads * self.d_v)       # (D, H*Dv)
        self.attention = ScaledDotProductAttention(dropout)
        self.W_o = Linear(num_heads * self.d_v, d_model)       # (H*Dv, D)

    @property
    def attn(self):
        return self.attention.attn

    def check_inputs(self, query, key, value, mask=None):
        for name, x in (("query", query), ("key", key), ("value", value)):
            checks.float_array("MultiHeadAttention", name, x, ndim=3, last_dim=self.d_model)
        if key.shape[1] == 0:
            raise ValueError(f"MultiHeadAttention: attention needs at least one key, got key of shape {tuple(key.shape)}")
        if key.shape != value.shape or query.shape[0] != key.shape[0]:
            raise ValueError(f"MultiHeadAttention: key and value must have the same shape (B, Tk, D) and query the "
                             f"same B, got query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
        if mask is not None:
            checks.mask("MultiHeadAttention", mask, (query.shape[0], self.num_heads, query.shape[1], key.shape[1]))

    def split_heads(self, x):                                  # (B,T,H*d) -> (B,H,T,d), d = Dk or Dv
        B, T, width = x.shape
        return x.reshape(B, T, self.num_heads, width // self.num_heads).transpose(0, 2, 1, 3)

    def merge_heads(self, x):                                  # (B,H,T,d) -> (B,T,H*d)
        B, H, T, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, H * d)

    def forward(self, query, key, value, mask=None):
        # 1. Project query, key and value, and split them into H heads.
        q = self.split_heads(self.W_q.forward(query))          # (B,H,Tq,Dk)
        k = self.split_heads(self.W_k.forward(key))            # (B,H,Tk,Dk)
        v = self.split_heads(self.W_v.forward(value))          # (B,H,Tk,Dv)
        # 2. Attend, every head at once.
        heads = self.attention.forward(q, k, v, mask)          # (B,H,Tq,Dv)
        # 3. Concatenate the heads and project.
        out = self.W_o.forward(self.merge_heads(heads))        # (B,Tq,H*Dv) -> (B,Tq,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,Tq,D); the three steps in reverse
        self.saved(dout)
        # 3. Back through W_o; splitting the heads undoes their concatenation.
        dheads = self.split_heads(self.W_o.backward(dout))     # (B,H,Tq,Dv)
        # 2. Back through attention.
        dq, dk, dv = self.attention.backward(dheads)           # (B,H,Tq,Dk), (B,H,Tk,Dk), (B,H,Tk,Dv)
        # 1. Merge the heads back and go through the projections.
        dquery = self.W_q.backward(self.merge_heads(dq))       # (B,Tq,D)
        dkey = self.W_k.backward(self.merge_heads(dk))         # (B,Tk,D)
        dvalue = self.W_v.backward(self.merge_heads(dv))       # (B,Tk,D)
        return dquery, dkey, dvalue

    def extra_repr(self):
        d_v = f", d_v={self.d_v}" if self.d_v != self.d_k else ""
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_k={self.d_k}{d_v}"
