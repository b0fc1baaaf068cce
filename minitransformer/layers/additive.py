"""Additive attention (Bahdanau et al., 2015), the alternative the paper weighs dot-product attention against
(§3.2.1: "similar for small d_k; additive outperforms dot product without scaling for larger d_k")."""

from __future__ import annotations

from .. import backend, checks
from ..module import Module, Parameter
from .activations import Softmax
from .attention import Mask, check_qkv
from .linear import xavier_uniform


class AdditiveAttention(Module):
    """score(q_i, k_j) = v_a^T tanh(q_i W_q + k_j W_k), then softmax over j and a weighted sum of the values.
                Shapes: q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv), mask broadcastable to (B,H,Tq,Tk) -> (B,H,Tq,Dv)
    The same inputs, mask and ``.attn`` as ScaledDotProductAttention: a query row whose keys are all masked
    gets zero weights. A small feed-forward network with one hidden layer of d_hidden units scores each
    (query, key) pair, so the cost is Tq*Tk*d_hidden per head instead of Tq*Tk*Dk for one dot product.
    Cache: q, k, v, the hidden tanh activations h (B,H,Tq,Tk,Dh), the weights, which rows have a key."""

    def __init__(self, d_k: int, d_hidden: int):
        super().__init__()
        self.d_k = checks.positive_int("AdditiveAttention", "d_k", d_k)
        self.d_hidden = checks.positive_int("AdditiveAttention", "d_hidden", d_hidden)
        self.W_q = Parameter(xavier_uniform(d_k, d_hidden))                      # (Dk, Dh)
        self.W_k = Parameter(xavier_uniform(d_k, d_hidden))                      # (Dk, Dh)
        self.v_a = Parameter(backend.host_rng().normal(0.0, d_hidden ** -0.5, size=d_hidden))  # (Dh,)
        self.mask_layer = Mask()
        self.softmax = Softmax(axis=-1)
        self.attn = None

    def check_inputs(self, q, k, v, mask=None):
        check_qkv("AdditiveAttention", q, k, v, mask)
        checks.float_array("AdditiveAttention", "q", q, last_dim=self.d_k)

    def forward(self, q, k, v, mask=None):
        q_h = q @ self.W_q.data                                # (B,H,Tq,Dh)
        k_h = k @ self.W_k.data                                # (B,H,Tk,Dh)
        h = backend.xp().tanh(q_h[..., :, None, :] + k_h[..., None, :, :])   # every pair   (B,H,Tq,Tk,Dh)
        scores = h @ self.v_a.data                             # v_a^T h   (B,H,Tq,Tk)
        has_key = None
        if mask is not None:
            scores = self.mask_layer.forward(scores, mask)
            has_key = mask.any(axis=-1, keepdims=True)         # False: every key of the row is masked
        attn = self.softmax.forward(scores)                    # (B,H,Tq,Tk), rows sum to 1
        if has_key is not None:
            attn = attn * has_key
        self.attn = attn
        out = attn @ v                                         # (B,H,Tq,Dv)
        self.save_for_backward(out, q=q, k=k, v=v, h=h, attn=attn, has_key=has_key)
        return out

    def backward(self, dout):                                  # dout (B,H,Tq,Dv)
        c = self.saved(dout)
        dv = c.attn.swapaxes(-1, -2) @ dout                    # (B,H,Tk,Dv)
        dattn = dout @ c.v.swapaxes(-1, -2)                    # (B,H,Tq,Tk)
        if c.has_key is not None:
            dattn = dattn * c.has_key
        dscores = self.softmax.backward(dattn)                 # (B,H,Tq,Tk)
        if c.has_key is not None:
            dscores = self.mask_layer.backward(dscores)
        Dh = self.d_hidden
        self.v_a.grad += (dscores[..., None] * c.h).reshape(-1, Dh).sum(axis=0)    # dv_a = sum dscores * h  (Dh,)
        dpre = dscores[..., None] * self.v_a.data * (1.0 - c.h * c.h)             # through tanh  (B,H,Tq,Tk,Dh)
        dq_h = dpre.sum(axis=-2)                               # q_i met every key     (B,H,Tq,Dh)
        dk_h = dpre.sum(axis=-3)                               # k_j met every query   (B,H,Tk,Dh)
        self.W_q.grad += c.q.reshape(-1, self.d_k).T @ dq_h.reshape(-1, Dh)      # (Dk, Dh)
        self.W_k.grad += c.k.reshape(-1, self.d_k).T @ dk_h.reshape(-1, Dh)      # (Dk, Dh)
        return dq_h @ self.W_q.data.T, dk_h @ self.W_k.data.T, dv             # dq, dk, dv

    def extra_repr(self):
        return f"d_k={self.d_k}, d_hidden={self.d_hidden}"
