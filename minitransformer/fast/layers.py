"""The fast twins of the core layers. Each subclasses its core twin and overrides only forward and
backward, with the same arithmetic written for speed:

- matrix products on 2-D views: one (N, in) @ (in, out) GEMM instead of a stack of B small ones;
- in-place work on arrays that no cache holds (fewer allocations, less memory traffic);
- dropout masks from 16-bit random integers, several times cheaper to draw than floats;
- projections that read the same input as one wide matrix product (stacked_linear);
- attention on packed rows (``Packing``): the position-wise work skips padding.
Each is tested equal to its core twin (tests/test_fast.py).
"""

from __future__ import annotations

import numpy

from .. import backend, checks
from .. import layers as core
from .packing import Packing, pack, unpack


class Linear(core.Linear):
    """out = x W + b on the 2-D view (N, in) of x: one GEMM."""

    def forward(self, x):                                      # x (..., in)
        x2d = x.reshape(-1, self.in_features)                  # (N, in), a view
        out = x2d @ self.W.data                                # (N, out)
        if self.b is not None:
            out += self.b.data                                 # in place: `out` is a fresh array no cache holds
        out = out.reshape(*x.shape[:-1], self.out_features)    # (..., out)
        self.save_for_backward(out, x2d=x2d)
        return out

    def backward(self, dout):                                  # dout (..., out)
        x2d = self.saved(dout).x2d
        dout2d = dout.reshape(-1, self.out_features)           # (N, out)
        self.W.grad += x2d.T @ dout2d                          # dW = x^T dout   (in, out)
        if self.b is not None:
            self.b.grad += dout2d.sum(axis=0)                  # db = sum_n dout (out,)
        return (dout2d @ self.W.data.T).reshape(*dout.shape[:-1], self.in_features)  # dx = dout W^T (..., in)


def stacked_linear(x, linears):
    """x [W_1 ... W_n] + [b_1 ... b_n] for n Linear layers that read the SAME input: one GEMM n times as
    wide does the same FLOPs faster than n narrow ones (x is read once, BLAS gets more work per call).
                                                      Shapes: x (..., in) -> (..., sum out_i), side by side
    The weights stay separate Parameters, concatenated for the product. No cache: the caller keeps x."""
    xp = backend.xp()
    x2d = x.reshape(-1, x.shape[-1])                                        # (N, in)
    out = x2d @ xp.concatenate([lin.W.data for lin in linears], axis=1)     # (N, sum out_i)
    out += xp.concatenate([lin.b.data if lin.b is not None else xp.zeros(lin.out_features, out.dtype)
                           for lin in linears])                             # one add over the whole output
    return out.reshape(*x.shape[:-1], out.shape[-1])                        # (..., sum out_i)


def stacked_linear_backward(x, linears, dout):
    """Backward of ``stacked_linear``: adds dW_i, db_i into each layer's .grad (all dW_i from one product
    x^T dout) and returns each input gradient dx_i = dout_i W_i^T.
                                            Shapes: x (..., in), dout (..., sum out_i) -> n arrays (..., in)"""
    x2d = x.reshape(-1, x.shape[-1])                                        # (N, in)
    dout2d = dout.reshape(x2d.shape[0], dout.shape[-1])                     # (N, sum out_i); N may be 0
    dW = x2d.T @ dout2d                                                     # (in, sum out_i)
    db = dout2d.sum(axis=0)                                                 # (sum out_i,)
    dxs, start = [], 0
    for lin in linears:
        cols = slice(start, start + lin.out_features)
        lin.W.grad += dW[:, cols]                                           # dW_i = x^T dout_i   (in, out_i)
        if lin.b is not None:
            lin.b.grad += db[cols]                                          # db_i = sum_n dout_i (out_i,)
        dxs.append((dout2d[:, cols] @ lin.W.data.T).reshape(x.shape))      # dx_i = dout_i W_i^T (..., in)
        start += lin.out_features
    return dxs


class Embedding(core.Embedding):
    """E[ids] * scale, scaled in place on the gathered copy."""

    def forward(self, ids):                                    # ids (B,T) int
        out = self.weight.data[ids]                            # (B,T,D), a gathered copy
        if self.scale != 1.0:
            out *= self.scale
        self.save_for_backward(out, ids=ids)
        return out


def random_uint16(shape):
    """Uniform random integers in [0, 65536), dtype uint16, drawn with ``backend.device_rng()``.

    On the CPU they are cut from 64-bit draws, four from each word: NumPy hands out full-range 64-bit
    integers straight from its bit generator, which is much cheaper per 16-bit number than asking it for
    uint16 or for floats. Every 64-bit value is equally likely, so each 16-bit quarter is uniform and
    independent of the others. On a GPU: one plain call of the generator.
    """
    xp = backend.xp()
    if xp is not numpy:
        return backend.device_rng().integers(0, 1 << 16, size=shape, dtype=xp.uint16)
    n = int(numpy.prod(shape))
    words = backend.device_rng().integers(0, 2**64 - 1, size=-(-n // 4), dtype=numpy.uint64, endpoint=True)
    return words.view(numpy.uint16)[:n].reshape(shape)         # four 16-bit integers per word


class Dropout(core.Dropout):
    """Dropout with the mask drawn from 16-bit random integers: an element is dropped when its integer is
    below round(p * 65536), so the drop rate is p to within 2^-17 (0.1 -> 0.1000061).
    ``out=x`` writes the result into x (for arrays no one else holds); backward takes ``out`` the same way."""

    def check_inputs(self, x, out=None):                       # module(x, out=x) checks x as the core does
        super().check_inputs(x)

    def forward(self, x, out=None):
        if not self.training or self.p == 0.0:
            self.save_for_backward(x, scaled_mask=None)
            return x
        xp = backend.xp()
        keep = random_uint16(x.shape) >= round(self.p * (1 << 16))                   # m, bool (...)
        scaled_mask = xp.multiply(keep, x.dtype.type(1.0 / (1.0 - self.p)))          # m / (1-p)  (...)
        result = xp.multiply(x, scaled_mask, out=out)                                 # (...)
        self.save_for_backward(result, scaled_mask=scaled_mask)
        return result

    def backward(self, dout, out=None):
        scaled_mask = self.saved(dout).scaled_mask
        return dout if scaled_mask is None else backend.xp().multiply(dout, scaled_mask, out=out)


class ReLU(core.ReLU):
    """max(0, x); ``out=x`` works in place (for arrays no one else holds), backward the same."""

    def check_inputs(self, x, out=None):                       # module(x, out=x) checks x as the core does
        super().check_inputs(x)

    def forward(self, x, out=None):
        positive = x > 0                                       # (...) bool, before x is overwritten
        result = backend.xp().maximum(x, 0, out=out)
        self.save_for_backward(result, positive=positive)
        return result

    def backward(self, dout, out=None):
        return backend.xp().multiply(dout, self.saved(dout).positive, out=out)


class Softmax(core.Softmax):
    """The softmax and its backward computed in place in buffers of their own."""

    def forward(self, x):
        xp = backend.xp()
        e = x - x.max(axis=self.axis, keepdims=True)           # (...) every row's max is 0
        xp.exp(e, out=e)
        e /= e.sum(axis=self.axis, keepdims=True)              # p
        self.save_for_backward(e, p=e)
        return e

    def backward(self, dout):
        xp = backend.xp()
        p = self.saved(dout).p
        dx = p * dout                                          # a buffer of ours
        s = dx.sum(axis=self.axis, keepdims=True)              # sum(p * dout)
        return xp.multiply(p, xp.subtract(dout, s, out=dx), out=dx)   # p * (dout - s), in place in dx


class LayerNorm(core.LayerNorm):
    """LayerNorm with its buffers reused in place: two (..., D) allocations in backward instead of seven."""

    def forward(self, x):                                      # x (..., D)
        xp = backend.xp()
        mean = x.mean(axis=-1, keepdims=True)                  # (..., 1)
        centered = x - mean                                    # (..., D)
        out = centered * centered                              # (..., D) squares; the buffer becomes `out`
        rstd = 1.0 / xp.sqrt(out.mean(axis=-1, keepdims=True) + self.eps)   # (..., 1)
        centered *= rstd                                       # x_hat
        xp.multiply(centered, self.gamma.data, out=out)
        out += self.beta.data                                  # x_hat * gamma + beta
        self.save_for_backward(out, x_hat=centered, rstd=rstd)
        return out

    def backward(self, dout):                                  # dout (..., D) -> dx (..., D)
        xp = backend.xp()
        cache = self.saved(dout)
        x_hat, rstd = cache.x_hat, cache.rstd
        work = dout * x_hat                                    # (..., D) a buffer of ours, reused below
        self.gamma.grad += work.reshape(-1, self.d_model).sum(axis=0)
        self.beta.grad += dout.reshape(-1, self.d_model).sum(axis=0)
        g = dout * self.gamma.data                             # dL/dx_hat
        # dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), in place in g and `work`
        g_xhat_mean = xp.multiply(g, x_hat, out=work).mean(axis=-1, keepdims=True)
        g -= g.mean(axis=-1, keepdims=True)
        g -= xp.multiply(x_hat, g_xhat_mean, out=work)
        g *= rstd
        return g


class ScaledDotProductAttention(core.ScaledDotProductAttention):
    """The core's attention with the scale and the empty rows applied in place."""

    def forward(self, q, k, v, mask=None):
        xp = backend.xp()
        scale = 1.0 / numpy.sqrt(q.shape[-1]) if self.scale else 1.0
        scores = q @ k.swapaxes(-1, -2)                        # (B,H,Tq,Tk)
        scores *= scores.dtype.type(scale)
        has_key = None
        if mask is not None:
            scores = self.mask_layer.forward(scores, mask)
            has_key = mask.any(axis=-1, keepdims=True)         # (B|1,1,Tq|1,1)
        attn = self.softmax.forward(scores)                    # (B,H,Tq,Tk)
        if has_key is not None:
            attn = xp.where(has_key, attn, attn.dtype.type(0))
        self.attn = attn
        attn_dropped = self.dropout.forward(attn)
        out = attn_dropped @ v                                 # (B,H,Tq,Dv)
        self.save_for_backward(out, q=q, k=k, v=v, attn_dropped=attn_dropped, scale=scale, has_key=has_key)
        return out

    def backward(self, dout):
        xp = backend.xp()
        c = self.saved(dout)
        dv = c.attn_dropped.swapaxes(-1, -2) @ dout            # (B,H,Tk,Dv)
        dattn = self.dropout.backward(dout @ c.v.swapaxes(-1, -2))
        self.dattn = dattn
        if c.has_key is not None:
            dattn = xp.where(c.has_key, dattn, dattn.dtype.type(0))
        dscores = self.softmax.backward(dattn)
        if c.has_key is not None:
            dscores = self.mask_layer.backward(dscores)
        dscores *= dscores.dtype.type(c.scale)                 # in place: dscores is a fresh array
        return dscores @ c.k, dscores.swapaxes(-1, -2) @ c.q, dv   # dq, dk, dv


class MultiHeadAttention(core.MultiHeadAttention):
    """Multi-head attention whose projections of one input run as one matrix product (Q, K and V in
    self-attention, where query is key is value; K and V in cross-attention, where key is value), on packed
    rows: packing=(query's, key's) ``Packing`` (either None) gives that side as (N, D) rows of its real
    tokens. Q, K and V are unpacked into their (B,T) grids for the heads and the heads' output packed
    again before W_o. The mask must hide the padded keys (the Transformer's masks do)."""

    def check_inputs(self, query, key, value, mask=None, packing=(None, None)):
        """The core's checks, on the (B,T,D) grids that packed sides stand for; a packed side must be (N,D)."""
        if not isinstance(packing, tuple) or len(packing) != 2 or \
                not all(p is None or isinstance(p, Packing) for p in packing):
            raise TypeError(f"MultiHeadAttention: packing must be a pair (query's, key's) of Packing or None, "
                            f"got {packing!r}")
        grids = []
        for name, x, rows in (("query", query, packing[0]), ("key", key, packing[1]), ("value", value, packing[1])):
            if rows is not None:
                checks.float_array("MultiHeadAttention", name, x)
                if tuple(x.shape) != (rows.size, self.d_model):
                    raise ValueError(f"MultiHeadAttention: {name} is packed, so it must have shape (N={rows.size} "
                                     f"real tokens, d_model={self.d_model}), got {tuple(x.shape)}")
                x = numpy.broadcast_to(numpy.zeros((), x.dtype), (*rows.shape, self.d_model))  # its grid's shape
            grids.append(x)
        super().check_inputs(*grids, mask)

    def forward(self, query, key, value, mask=None, packing=(None, None)):
        q_rows, k_rows = packing
        inner = self.num_heads * self.d_k                      # H*Dk: the width of Q and of K
        if query is key and key is value:
            linears = (self.W_q, self.W_k, self.W_v)
            qkv = unpack(q_rows, stacked_linear(query, linears))                  # (B,Tq,2 H*Dk + H*Dv)
            q, k, v = qkv[..., :inner], qkv[..., inner:2 * inner], qkv[..., 2 * inner:]
        elif key is value:
            linears = (self.W_k, self.W_v)
            q = unpack(q_rows, self.W_q.forward(query))                           # (B,Tq,H*Dk)
            kv = unpack(k_rows, stacked_linear(key, linears))                     # (B,Tk,H*Dk + H*Dv)
            k, v = kv[..., :inner], kv[..., inner:]
        else:
            linears = None
            q = unpack(q_rows, self.W_q.forward(query))
            k, v = unpack(k_rows, self.W_k.forward(key)), unpack(k_rows, self.W_v.forward(value))
        heads = self.attention.forward(self.split_heads(q), self.split_heads(k), self.split_heads(v), mask)
        out = self.W_o.forward(pack(q_rows, self.merge_heads(heads)))             # (B,Tq,D) or (Nq,D)
        stacked = None if linears is None else ((query if len(linears) == 3 else key), linears)
        self.save_for_backward(out, stacked=stacked, packing=packing)
        return out

    def backward(self, dout):                                  # dout (B,Tq,D) or (Nq,D)
        c = self.saved(dout)
        q_rows, k_rows = c.packing
        dheads = self.split_heads(unpack(q_rows, self.W_o.backward(dout)))       # (B,H,Tq,Dv)
        dq, dk, dv = self.attention.backward(dheads)
        if c.stacked is None:
            return (self.W_q.backward(pack(q_rows, self.merge_heads(dq))),
                    self.W_k.backward(pack(k_rows, self.merge_heads(dk))),
                    self.W_v.backward(pack(k_rows, self.merge_heads(dv))))
        x, linears = c.stacked
        if len(linears) == 3:                                  # self-attention: Q, K, V from one x
            return tuple(stacked_linear_backward(x, linears, pack(q_rows, self.merge_heads_stacked(dq, dk, dv))))
        dquery = self.W_q.backward(pack(q_rows, self.merge_heads(dq)))   # cross-attention: K, V from one memory
        dkey, dvalue = stacked_linear_backward(x, linears, pack(k_rows, self.merge_heads_stacked(dk, dv)))
        return dquery, dkey, dvalue

    def merge_heads_stacked(self, *xs):                        # (B,H,T,d_i) each -> (B,T,sum_i H*d_i)
        """[merge_heads(x_1) ... merge_heads(x_n)] side by side, written in one pass (no concatenate); the
        widths d_i may differ (Dk for queries and keys, Dv for values)."""
        B, H, T, _ = xs[0].shape
        out = backend.xp().empty((B, T, sum(H * x.shape[-1] for x in xs)), dtype=xs[0].dtype)  # (B,T,sum H*d_i)
        start = 0
        for x in xs:
            d = x.shape[-1]
            # Splitting the last axis of a column slice is a view, so this writes into out.
            out[:, :, start:start + H * d].reshape(B, T, H, d)[...] = x.transpose(0, 2, 1, 3)   # (B,T,H,d)
            start += H * d
        return out


class PositionwiseFeedForward(core.PositionwiseFeedForward):
    """The FFN with ReLU and dropout in place on the hidden activations h (B,T,F), W1's fresh output, and
    in backward on the fresh gradient W2.backward returns: four (B,T,F) temporaries fewer, the widest
    arrays of a layer. W2 caches its input, the final h, so nothing it needs changes."""

    def forward(self, x):                                      # x (B,T,D) or (N,D)
        h = self.W1.forward(x)                                 # (B,T,F)
        h = self.relu.forward(h, out=h)
        out = self.W2.forward(self.dropout.forward(h, out=h))  # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        dh = self.W2.backward(dout)                            # (B,T,F), fresh
        dh = self.relu.backward(self.dropout.backward(dh, out=dh), out=dh)
        return self.W1.backward(dh)
