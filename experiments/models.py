"""The small models and the two attention layers the experiments need beyond the package's core.

Built from the core layers (mt.layers.*), each with a forward and a hand-written backward like theirs:
    SelfAttention       a q, k, v attention layer used as self-attention on x (B,T,D) -> (B,T,D)
    MultiHeadSelfAttention   the same for MultiHeadAttention, projections included
    BandedAttention     restricted self-attention computed on the band only: O(r n d) work, where the core's
                        band mask (mt.masks.local_mask) still fills the whole n x n grid
    NoSoftmaxAttention  weights = the raw scores (or the scores over the sum of their sizes): is softmax needed?
    Retrieval           key-value retrieval through one attention layer, its scoring function chosen by name
    Tagger              embeddings + an encoder stack + a linear read-out per position (copy, reverse)
tests/test_experiments.py checks each backward against finite differences, and BandedAttention against the
core's attention with the band mask.
"""

from __future__ import annotations

import math

import numpy

import minitransformer as mt
from minitransformer import backend
from minitransformer.layers import (
    AdditiveAttention,
    Embedding,
    LearnedPositionalEmbedding,
    Linear,
    Mask,
    MultiHeadAttention,
    ScaledDotProductAttention,
    Softmax,
)
from minitransformer.model import Encoder


class SelfAttention(mt.Module):
    """out = Attention(x, x, x) for an attention layer on heads (B,H,T,Dk), with one head.
                                                                      Shapes: x (B,T,D), mask -> (B,T,D)
    x is query, key and value at once, so its gradient is dq + dk + dv.
    Cache: held by the attention layer.
    """

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x, mask=None):                           # x (B,T,D)
        h = x[:, None]                                         # one head   (B,1,T,D)
        out = self.attention.forward(h, h, h, mask)[:, 0]      # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        self.saved(dout)
        dq, dk, dv = self.attention.backward(dout[:, None])    # (B,1,T,D) each
        return (dq + dk + dv)[:, 0]


class MultiHeadSelfAttention(mt.Module):
    """out = MultiHeadAttention(x, x, x), projections included.        Shapes: x (B,T,D), mask -> (B,T,D)
    Cache: held by the MultiHeadAttention."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, num_heads)

    def forward(self, x, mask=None):                           # x (B,T,D)
        out = self.attention.forward(x, x, x, mask)            # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dx (B,T,D)
        self.saved(dout)
        return sum(self.attention.backward(dout))              # dquery + dkey + dvalue


class BandedAttention(mt.Module):
    """Restricted self-attention (§4) on the band alone: position i attends to i - r .. i + r.
                                         Shapes: q, k (B,H,T,Dk), v (B,H,T,Dv), mask ignored -> (B,H,T,Dv)

    The keys are padded with r zero rows at both ends and read through 2r + 1 shifted views, one per
    offset j (key position i + j - r), so the scores are (B,H,T,2r+1) instead of (B,H,T,T): O(r n d) work.
    Offsets that fall outside the sequence are masked. Equal to ScaledDotProductAttention with
    mt.masks.local_mask(T, r). ``.attn`` is (B,H,T,2r+1): column j is the weight of key i + j - r.
    Cache: q, the padded k and v, the weights; the Mask and Softmax children keep theirs.
    """

    def __init__(self, r: int):
        super().__init__()
        self.r = mt.checks.integer("BandedAttention", "r", r)
        self.mask_layer = Mask()
        self.softmax = Softmax(axis=-1)
        self.attn = None

    def forward(self, q, k, v, mask=None):
        xp = backend.xp()
        T, r = q.shape[-2], self.r
        pad = [(0, 0)] * (q.ndim - 2) + [(r, r), (0, 0)]
        k_pad, v_pad = xp.pad(k, pad), xp.pad(v, pad)          # (B,H,T+2r,Dk), (B,H,T+2r,Dv)
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = xp.stack([(q * k_pad[..., j:j + T, :]).sum(axis=-1) for j in range(2 * r + 1)],
                          axis=-1) * scale                     # q_i . k_{i+j-r} / sqrt(d_k)   (B,H,T,2r+1)
        i, j = xp.arange(T)[:, None], xp.arange(2 * r + 1)[None, :]
        inside = (i + j - r >= 0) & (i + j - r < T)            # the key exists   (T,2r+1)
        attn = self.softmax.forward(self.mask_layer.forward(scores, inside))    # (B,H,T,2r+1)
        self.attn = attn
        out = sum(attn[..., j, None] * v_pad[..., j:j + T, :] for j in range(2 * r + 1))   # (B,H,T,Dv)
        self.save_for_backward(out, q=q, k_pad=k_pad, v_pad=v_pad, attn=attn, scale=scale)
        return out

    def backward(self, dout):                                  # dout (B,H,T,Dv)
        xp = backend.xp()
        c = self.saved(dout)
        T, r = dout.shape[-2], self.r
        dv_pad = xp.zeros_like(c.v_pad)                        # (B,H,T+2r,Dv)
        dattn = xp.zeros_like(c.attn)                          # (B,H,T,2r+1)
        for j in range(2 * r + 1):
            dattn[..., j] = (dout * c.v_pad[..., j:j + T, :]).sum(axis=-1)
            dv_pad[..., j:j + T, :] += c.attn[..., j, None] * dout       # key i+j-r gave to query i
        dscores = self.mask_layer.backward(self.softmax.backward(dattn)) * c.scale   # (B,H,T,2r+1)
        dq = sum(dscores[..., j, None] * c.k_pad[..., j:j + T, :] for j in range(2 * r + 1))   # (B,H,T,Dk)
        dk_pad = xp.zeros_like(c.k_pad)                        # (B,H,T+2r,Dk)
        for j in range(2 * r + 1):
            dk_pad[..., j:j + T, :] += dscores[..., j, None] * c.q
        return dq, dk_pad[..., r:r + T, :], dv_pad[..., r:r + T, :]   # the padding rows had no input

    def extra_repr(self):
        return f"r={self.r}"


class NoSoftmaxAttention(mt.Module):
    """Attention without the softmax: out = W V with W = S (raw) or W = S / (sum_j |S_j| + 1) (normalised),
    S = Q K^T / sqrt(d_k), and 0 where the mask is False.
                 Shapes: q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv), mask broadcastable to (B,H,Tq,Tk) -> (B,H,Tq,Dv)

    The normalised form keeps each row's weights summing to at most 1 in size, as softmax's do, but signed
    and without the exponential that makes one key win; the 1 keeps an all-zero row finite.
    Cache: q, k, v, the scores, the weights, the row sizes.
    """

    def __init__(self, normalise: bool):
        super().__init__()
        self.normalise = mt.checks.boolean("NoSoftmaxAttention", "normalise", normalise)
        self.attn = None

    def forward(self, q, k, v, mask=None):
        xp = backend.xp()
        scale = 1.0 / math.sqrt(q.shape[-1])
        s = (q @ k.swapaxes(-1, -2)) * scale                   # (B,H,Tq,Tk)
        if mask is not None:
            s = s * mask                                       # a masked key gives nothing
        size = xp.abs(s).sum(axis=-1, keepdims=True) + 1.0 if self.normalise else None   # (B,H,Tq,1)
        w = s / size if self.normalise else s                  # (B,H,Tq,Tk)
        self.attn = w
        out = w @ v                                            # (B,H,Tq,Dv)
        self.save_for_backward(out, q=q, k=k, v=v, s=s, w=w, size=size, mask=mask, scale=scale)
        return out

    def weights_backward(self, dw, c):
        """dL/dS from dL/dW: the identity (raw), or through W = S / (sum|S| + 1)."""
        if not self.normalise:
            return dw
        xp = backend.xp()
        return dw / c.size - xp.sign(c.s) * (dw * c.s).sum(axis=-1, keepdims=True) / c.size ** 2

    def backward(self, dout):                                  # dout (B,H,Tq,Dv)
        c = self.saved(dout)
        dv = c.w.swapaxes(-1, -2) @ dout                       # (B,H,Tk,Dv)
        ds = self.weights_backward(dout @ c.v.swapaxes(-1, -2), c)   # (B,H,Tq,Tk)
        if c.mask is not None:
            ds = ds * c.mask
        self.score_grad = ds
        ds = ds * c.scale
        return ds @ c.k, ds.swapaxes(-1, -2) @ c.q, dv         # dq, dk, dv

    def extra_repr(self):
        return f"normalise={self.normalise}"


def make_attention(kind: str, d_k: int):
    """The scoring functions compared in §3.2.1, and the two without softmax. "additive" has a hidden layer of
    d_k units; "additive:H" one of H units."""
    if kind == "dot":
        return ScaledDotProductAttention(scale=False)
    if kind == "scaled":
        return ScaledDotProductAttention(scale=True)
    if kind == "additive":
        return AdditiveAttention(d_k, d_hidden=d_k)
    if kind.startswith("additive:") and kind[len("additive:"):].isdigit():
        return AdditiveAttention(d_k, d_hidden=int(kind[len("additive:"):]))
    if kind in ("raw", "normalised"):
        return NoSoftmaxAttention(normalise=kind == "normalised")
    raise ValueError(f"unknown attention kind {kind!r}: dot, scaled, additive, additive:H, raw or normalised")


def softmax_score_grad(attn, dattn):
    """dL/dscores at the softmax's input, from its weights p and dL/dp: p * (dattn - sum(p * dattn))."""
    return attn * (dattn - (attn * dattn).sum(axis=-1, keepdims=True))


class Retrieval(mt.Module):
    """Key-value retrieval through one attention layer: the only path from a query to its value.
                      Shapes: keys (B,n), values (B,n), queries (B,m) int -> logits (B,m,num_values)

    q = E[query] W_q, k = E[key] W_k (one embedding table E, read twice: a query names a key),
    v = E_v[value] W_v, out = Attention(q, k, v) W_o. W_q and W_k are drawn with variance 1/d_model, so with
    unit-size embeddings the components of q and k have variance 1: the paper's premise (§3.2.1, footnote 4)
    under which q . k has variance d_k.
    After backward, ``score_grad`` holds dL/dscores at the input of the softmax (or of the weights, without it).
    Cache: the values' projection v, for the gradient at the scores.
    """

    def __init__(self, num_keys: int, num_values: int, d_model: int, d_k: int, kind: str):
        super().__init__()
        self.kind = kind
        self.key_embedding = Embedding(num_keys, d_model, scale=True)
        self.query_embedding = Embedding(num_keys, d_model, scale=True)
        self.query_embedding.weight = self.key_embedding.weight     # tied: both reads add into one gradient
        self.value_embedding = Embedding(num_values, d_model, scale=True)
        self.W_q = Linear(d_model, d_k, bias=False)
        self.W_k = Linear(d_model, d_k, bias=False)
        for W in (self.W_q.W, self.W_k.W):
            W.data[...] = backend.asarray(backend.host_rng().normal(0.0, d_model ** -0.5, size=(d_model, d_k)))
        self.W_v = Linear(d_model, d_model, bias=False)
        self.attention = make_attention(kind, d_k)
        self.W_o = Linear(d_model, num_values)
        self.score_grad = None

    def forward(self, keys, values, queries):
        q = self.W_q.forward(self.query_embedding.forward(queries))[:, None]   # (B,1,m,Dk)
        k = self.W_k.forward(self.key_embedding.forward(keys))[:, None]        # (B,1,n,Dk)
        v = self.W_v.forward(self.value_embedding.forward(values))[:, None]    # (B,1,n,D)
        out = self.attention.forward(q, k, v)                  # (B,1,m,D)
        logits = self.W_o.forward(out[:, 0])                   # (B,m,V)
        self.save_for_backward(logits, v=v)
        return logits

    def backward(self, dlogits):                               # dlogits (B,m,V)
        c = self.saved(dlogits)
        dout = self.W_o.backward(dlogits)[:, None]             # (B,1,m,D)
        if self.kind in ("raw", "normalised"):                 # no softmax: the layer keeps dL/dS itself
            dq, dk, dv = self.attention.backward(dout)
            self.score_grad = self.attention.score_grad        # (B,1,m,n)
        else:                                                  # dL/dweights = dout v^T, then back through softmax
            self.score_grad = softmax_score_grad(self.attention.attn, dout @ c.v.swapaxes(-1, -2))   # (B,1,m,n)
            dq, dk, dv = self.attention.backward(dout)
        self.value_embedding.backward(self.W_v.backward(dv[:, 0]))
        self.key_embedding.backward(self.W_k.backward(dk[:, 0]))
        self.query_embedding.backward(self.W_q.backward(dq[:, 0]))

    def extra_repr(self):
        return f"kind={self.kind}"


def retrieval_batch(rng, batch: int, n: int, m: int, num_keys: int, num_values: int):
    """n distinct keys per example, each with a random value, and m queries among them.
    Returns keys (B,n), values (B,n), queries (B,m), targets (B,m)."""
    keys = numpy.argsort(rng.random((batch, num_keys)), axis=1)[:, :n]          # (B,n) distinct
    values = rng.integers(0, num_values, size=(batch, n))                      # (B,n)
    pick = rng.integers(0, n, size=(batch, m))                                 # (B,m)
    rows = numpy.arange(batch)[:, None]
    return keys, values, keys[rows, pick], values[rows, pick]


class Tagger(mt.Module):
    """One output token per input position: E[ids] * sqrt(D) + P, num_layers encoder layers, a linear read-out.
                                                    Shapes: ids (B,T) int, mask (..,T,T) -> logits (B,T,V)
    Learned positions (P): the reverse task routes by position alone, which a learned table expresses directly.
    Cache: held by the children.
    """

    def __init__(self, vocab: int, max_len: int, d_model: int, num_heads: int, d_ff: int, num_layers: int):
        super().__init__()
        self.embedding = Embedding(vocab, d_model, scale=True)
        self.positions = LearnedPositionalEmbedding(max_len, d_model)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff)
        self.read_out = Linear(d_model, vocab)

    def forward(self, ids, mask=None):
        x = self.positions.forward(self.embedding.forward(ids))   # (B,T,D)
        logits = self.read_out.forward(self.encoder.forward(x, mask))   # (B,T,V)
        self.save_for_backward(logits)
        return logits

    def backward(self, dlogits):                               # dlogits (B,T,V)
        self.saved(dlogits)
        dx = self.encoder.backward(self.read_out.backward(dlogits))
        self.embedding.backward(self.positions.backward(dx))
