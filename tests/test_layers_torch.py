"""PyTorch as the second oracle: LayerNorm, Softmax and MultiHeadAttention forward and backward equal
torch's to 1e-10 in float64, with the weights copied across. Skipped where torch is not installed."""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L

torch = pytest.importorskip("torch")
TOL = 1e-10


def t(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def test_layernorm_matches_torch(float64, rng):
    x = rng.standard_normal((3, 5, 7)) * 4 + 1
    dout = rng.standard_normal((3, 5, 7))
    ln = L.LayerNorm(7, eps=1e-5)
    ln.gamma.data[...] = rng.standard_normal(7)
    ln.beta.data[...] = rng.standard_normal(7)
    ref = torch.nn.LayerNorm(7, eps=1e-5).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(ln.gamma.data))
        ref.bias.copy_(torch.tensor(ln.beta.data))
    xt = t(x)
    yt = ref(xt)
    (yt * t(dout, False)).sum().backward()
    y = ln(x)
    dx = ln.backward(dout)
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(ln.gamma.grad, ref.weight.grad.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(ln.beta.grad, ref.bias.grad.numpy(), atol=TOL, rtol=0)


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_matches_torch(float64, rng, axis):
    x = rng.standard_normal((3, 4, 5)) * 3
    dout = rng.standard_normal((3, 4, 5))
    sm = L.Softmax(axis=axis)
    xt = t(x)
    yt = torch.softmax(xt, dim=axis)
    (yt * t(dout, False)).sum().backward()
    np.testing.assert_allclose(sm(x), yt.detach().numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(sm.backward(dout), xt.grad.numpy(), atol=TOL, rtol=0)


def copy_mha_into_torch(mha, ref):
    """Ours stores W as (in, out); torch packs [W_q; W_k; W_v] as rows (out, in)."""
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(np.concatenate([mha.W_q.W.data.T, mha.W_k.W.data.T,
                                                             mha.W_v.W.data.T])))
        ref.in_proj_bias.copy_(torch.tensor(np.concatenate([mha.W_q.b.data, mha.W_k.b.data, mha.W_v.b.data])))
        ref.out_proj.weight.copy_(torch.tensor(mha.W_o.W.data.T))
        ref.out_proj.bias.copy_(torch.tensor(mha.W_o.b.data))


@pytest.mark.parametrize("kind", ["self_causal", "cross_padding"])
def test_multi_head_attention_matches_torch(float64, rng, kind):
    B, Tq, Tk, D, H = 3, 5, 7, 12, 3
    mha = L.MultiHeadAttention(D, H)
    for p in mha.parameters():                           # non-zero biases, so their gradients are tested too
        p.data[...] = rng.standard_normal(p.data.shape) * 0.3
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
    copy_mha_into_torch(mha, ref)
    ids = rng.integers(3, 9, size=(B, Tk))
    ids[0, 4:] = 0
    ids[2, 6:] = 0
    if kind == "self_causal":
        x = rng.standard_normal((B, Tq, D))
        q, k, v = x, x, x
        ids = ids[:, :Tq]
        mask = mt.masks.padding_mask(ids, 0) & mt.masks.subsequent_mask(Tq)
        attn_mask = torch.triu(torch.ones(Tq, Tq, dtype=torch.bool), 1)   # torch: True = NOT allowed
    else:
        q = rng.standard_normal((B, Tq, D))
        k = v = rng.standard_normal((B, Tk, D))
        mask = mt.masks.padding_mask(ids, 0)
        attn_mask = None
    dout = rng.standard_normal((B, Tq, D))
    qt, kt, vt = t(q), t(k), t(v)
    yt, wt = ref(qt, kt, vt, key_padding_mask=torch.tensor(ids == 0), attn_mask=attn_mask,
                 need_weights=True, average_attn_weights=False)
    (yt * t(dout, False)).sum().backward()
    y = mha(q, k, v, mask)
    dq, dk, dv = mha.backward(dout)
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(mha.attn, wt.detach().numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(dq, qt.grad.numpy(), atol=TOL, rtol=0)   # qt, kt, vt are separate leaves
    np.testing.assert_allclose(dk, kt.grad.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(dv, vt.grad.numpy(), atol=TOL, rtol=0)
    W = [mha.W_q.W.grad.T, mha.W_k.W.grad.T, mha.W_v.W.grad.T]
    np.testing.assert_allclose(np.concatenate(W), ref.in_proj_weight.grad.numpy(), atol=TOL, rtol=0)
    bias = np.concatenate([mha.W_q.b.grad, mha.W_k.b.grad, mha.W_v.b.grad])
    np.testing.assert_allclose(bias, ref.in_proj_bias.grad.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(mha.W_o.W.grad.T, ref.out_proj.weight.grad.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(mha.W_o.b.grad, ref.out_proj.bias.grad.numpy(), atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["self_causal", "cross_padding"])
def test_multi_head_attention_with_d_v_apart_matches_torch(float64, rng, kind):
    """d_v != d_k, which torch.nn.MultiheadAttention cannot express (its heads are embed_dim / num_heads wide for
    queries, keys and values alike): the oracle is the paper's MultiHead written with torch tensors, autograd
    and torch's scaled_dot_product_attention, which takes values of another width than the keys."""
    B, Tq, Tk, D, H, d_k, d_v = 3, 5, 7, 12, 3, 2, 5
    mha = L.MultiHeadAttention(D, H, d_k=d_k, d_v=d_v)
    for p in mha.parameters():                           # non-zero biases, so their gradients are tested too
        p.data[...] = rng.standard_normal(p.data.shape) * 0.3
    ids = rng.integers(3, 9, size=(B, Tk))
    ids[0, 4:] = 0
    ids[2, 6:] = 0
    if kind == "self_causal":
        x = rng.standard_normal((B, Tq, D))
        q, k, v = x, x, x
        mask = mt.masks.padding_mask(ids[:, :Tq], 0) & mt.masks.subsequent_mask(Tq)
    else:
        q = rng.standard_normal((B, Tq, D))
        k = v = rng.standard_normal((B, Tk, D))
        mask = mt.masks.padding_mask(ids, 0)
    dout = rng.standard_normal((B, Tq, D))
    weights = {name: t(p.data) for name, p in mha.named_parameters()}
    qt, kt, vt = t(q), t(k), t(v)

    def heads(x, name, width):                           # (B,T,D) -> (B,H,T,width)
        y = x @ weights[f"{name}.W"] + weights[f"{name}.b"]
        return y.reshape(x.shape[0], x.shape[1], H, width).transpose(1, 2)

    o = torch.nn.functional.scaled_dot_product_attention(heads(qt, "W_q", d_k), heads(kt, "W_k", d_k),
                                                         heads(vt, "W_v", d_v), attn_mask=torch.tensor(mask))
    yt = o.transpose(1, 2).reshape(B, Tq, H * d_v) @ weights["W_o.W"] + weights["W_o.b"]
    (yt * t(dout, False)).sum().backward()
    y = mha(q, k, v, mask)
    dq, dk, dv = mha.backward(dout)
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=TOL, rtol=0)
    for ours, theirs in ((dq, qt), (dk, kt), (dv, vt)):   # qt, kt, vt are separate leaves
        np.testing.assert_allclose(ours, theirs.grad.numpy(), atol=TOL, rtol=0)
    for name, p in mha.named_parameters():
        np.testing.assert_allclose(p.grad, weights[name].grad.numpy(), atol=TOL, rtol=0, err_msg=name)
