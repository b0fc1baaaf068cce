"""The layers the paper weighs self-attention against (Table 1, §3.2.1, §4): what each one means, its
gradients, and PyTorch as a second oracle.

Forward tests state the meaning: the RNN's output at t reads no later input; the band mask lets i see j only
for |i - j| <= r and combines with the padding and subsequent masks by &; the convolution equals its double
sum written with loops; additive attention's weights sum to 1 over the unmasked keys; scale=False is
softmax(Q K^T) V. Gradient checks: float64, random upstream gradient, odd distinct sizes, masks and padding,
max relative error below 1e-6 for every input and parameter.
"""

import math

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L

# These tests hand host arrays to the layers and read host arrays back. On a device backend the same layers
# are gradient-checked by `minitransformer gradcheck` (benchmarks/gpu.sh runs it there).
pytestmark = pytest.mark.skipif(mt.get_backend() != "numpy", reason="host arrays in and out: NumPy backend only")

BOUND = 1e-6
B, T, D = 3, 7, 5          # odd and distinct: a transposed gradient cannot pass by accident


def gradcheck(module, *inputs):
    report = mt.gradcheck.check(module, *inputs)
    report.assert_ok(BOUND)
    checked = {r.name for r in report.rows}
    missing = [name for name, _ in module.named_parameters() if name not in checked]
    assert not missing, f"parameters left out of the check: {missing}"
    assert report.max_error < BOUND
    return report


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def padded_ids(rng, batch, length):
    ids = rng.integers(3, 9, size=(batch, length))
    ids[0, length - 2:] = 0                 # two padded keys at the end of sentence 0
    ids[2, 3:] = 0                          # sentence 2 keeps three keys
    return ids


# --- RNN ---------------------------------------------------------------------------------------------

def test_rnn_output_at_t_depends_on_no_later_input(float64, rng):
    rnn = L.RNN(D).eval()
    x = rng.standard_normal((B, T, D))
    out = rnn(x)
    for t in range(T - 1):
        changed = x.copy()
        changed[:, t + 1:] = rng.standard_normal((B, T - t - 1, D)) * 5
        after = rnn(changed)
        np.testing.assert_array_equal(after[:, :t + 1], out[:, :t + 1])   # exactly: nothing later was read
        assert np.abs(after[:, t + 1:] - out[:, t + 1:]).max() > 1e-3      # while later outputs did change


def test_rnn_last_output_depends_on_the_first_input(float64, rng):
    """The other half of the meaning (a layer that looked at x_t alone would pass the causality test)."""
    rnn = L.RNN(D)
    x = rng.standard_normal((B, T, D))
    rnn(x)
    dout = np.zeros((B, T, D))
    dout[:, -1] = rng.standard_normal((B, D))
    dx = rnn.backward(dout)
    assert np.all(np.abs(dx[:, 0]).sum(axis=-1) > 0)


def test_rnn_equals_its_recurrence(float64, rng):
    rnn = L.RNN(D)
    rnn.b.data[...] = rng.standard_normal(D)
    x = rng.standard_normal((B, T, D))
    out = rnn(x)
    for b in range(B):
        h = np.zeros(D)
        for t in range(T):
            h = np.tanh(x[b, t] @ rnn.W_x.data + h @ rnn.W_h.data + rnn.b.data)
            np.testing.assert_allclose(out[b, t], h, rtol=0, atol=1e-12)


def test_rnn_gradcheck(float64, rng):
    rnn = L.RNN(D)
    rnn.b.data[...] = rng.standard_normal(D) * 0.3
    gradcheck(rnn, rng.standard_normal((B, T, D)))


# --- local_mask ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("T_, r", [(1, 0), (6, 0), (7, 1), (9, 3), (5, 4), (4, 10)])
def test_local_mask_is_the_band_abs_i_minus_j_at_most_r(T_, r):
    mask = mt.to_numpy(mt.masks.local_mask(T_, r))
    assert mask.shape == (1, 1, T_, T_) and mask.dtype == bool
    for i in range(T_):
        for j in range(T_):
            assert mask[0, 0, i, j] == (abs(i - j) <= r), (i, j)


def test_local_mask_combines_with_subsequent_and_padding_masks(rng):
    T_, r = 9, 2
    band = mt.to_numpy(mt.masks.local_mask(T_, r))
    causal = band & mt.to_numpy(mt.masks.subsequent_mask(T_))              # (1,1,T,T)
    ids = padded_ids(rng, B, T_)
    padded = band & mt.to_numpy(mt.masks.padding_mask(ids, 0))            # (B,1,T,T)
    assert padded.shape == (B, 1, T_, T_)
    for i in range(T_):
        for j in range(T_):
            assert causal[0, 0, i, j] == (0 <= i - j <= r)
            for b in range(B):
                assert padded[b, 0, i, j] == (abs(i - j) <= r and ids[b, j] != 0)


def test_local_mask_in_attention_gives_zero_weight_outside_the_band(float64, rng):
    T_, r = 8, 2
    q, k, v = (rng.standard_normal((B, 2, T_, 4)) for _ in range(3))
    mask = mt.masks.local_mask(T_, r) & mt.masks.subsequent_mask(T_)
    attention = L.ScaledDotProductAttention()
    attention(q, k, v, mask)
    w = attention.attn
    i, j = np.indices((T_, T_))
    assert np.all(w[..., ~((0 <= i - j) & (i - j <= r))] == 0)
    assert np.all(w[..., (0 <= i - j) & (i - j <= r)] > 0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


def test_multi_head_attention_with_local_and_padding_masks_gradcheck(float64, rng):
    T_ = 9
    x = rng.standard_normal((B, T_, 6))
    mask = mt.masks.local_mask(T_, 2) & mt.masks.padding_mask(padded_ids(rng, B, T_), 0)
    gradcheck(L.MultiHeadAttention(6, 3), x, x.copy(), x.copy(), mask)


def test_multi_head_attention_with_local_and_subsequent_masks_gradcheck(float64, rng):
    x = rng.standard_normal((B, T, 6))
    mask = mt.masks.local_mask(T, 1) & mt.masks.subsequent_mask(T)
    gradcheck(L.MultiHeadAttention(6, 2, d_k=5), x, x.copy(), x.copy(), mask)


# --- Conv1d ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, 5, 9])          # 9 > T: windows reach past both ends
def test_conv1d_equals_the_double_sum(float64, rng, k):
    conv = L.Conv1d(D, k)
    conv.b.data[...] = rng.standard_normal(D)
    x = rng.standard_normal((2, T, D))
    out = conv(x)
    p = k // 2
    expected = np.zeros((2, T, D))
    for b in range(2):
        for t in range(T):
            for o in range(D):
                total = conv.b.data[o]
                for j in range(k):                  # offset in the window
                    s = t + j - p                   # the input position it reads
                    if 0 <= s < T:                  # "same" padding: zeros outside the sequence
                        for c in range(D):          # input channel
                            total += x[b, s, c] * conv.W.data[j, c, o]
                expected[b, t, o] = total
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def test_conv1d_output_sees_only_its_window(float64, rng):
    conv = L.Conv1d(D, 3).eval()
    x = rng.standard_normal((1, T, D))
    out = conv(x)
    changed = x.copy()
    changed[:, 4] += 1.0
    diff = np.abs(conv(changed) - out).max(axis=-1)[0]        # (T,)
    assert np.all(diff[[3, 4, 5]] > 0) and np.all(diff[[0, 1, 2, 6]] == 0)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_conv1d_gradcheck(float64, rng, k):
    conv = L.Conv1d(D, k)
    conv.b.data[...] = rng.standard_normal(D)
    gradcheck(conv, rng.standard_normal((B, T, D)))


def test_conv1d_kernel_longer_than_the_sequence_gradcheck(float64, rng):
    gradcheck(L.Conv1d(D, 9), rng.standard_normal((B, 4, D)))


# --- AdditiveAttention ------------------------------------------------------------------------------

Dk, Dh, Dv, Tq, Tk, H = 4, 9, 6, 5, 7, 2


def qkv(rng):
    return (rng.standard_normal((B, H, Tq, Dk)), rng.standard_normal((B, H, Tk, Dk)),
            rng.standard_normal((B, H, Tk, Dv)))


def test_additive_scores_are_v_tanh_of_the_projected_pair(float64, rng):
    att = L.AdditiveAttention(Dk, Dh)
    q, k, v = qkv(rng)
    out = att(q, k, v)
    for b, h, i in [(0, 0, 0), (2, 1, 4), (1, 0, 3)]:
        scores = np.array([att.v_a.data @ np.tanh(q[b, h, i] @ att.W_q.data + k[b, h, j] @ att.W_k.data)
                           for j in range(Tk)])
        weights = np.exp(scores) / np.exp(scores).sum()
        np.testing.assert_allclose(att.attn[b, h, i], weights, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out[b, h, i], weights @ v[b, h], rtol=0, atol=1e-12)


def test_additive_weights_sum_to_one_over_unmasked_keys_and_are_zero_on_masked(float64, rng):
    att = L.AdditiveAttention(Dk, Dh)
    q, k, v = qkv(rng)
    mask = np.broadcast_to(mt.to_numpy(mt.masks.padding_mask(padded_ids(rng, B, Tk), 0)), (B, 1, Tq, Tk)).copy()
    mask[1, 0, 2] = False                                    # one query row with every key masked
    out = att(q, k, v, mask)
    w = att.attn
    full = np.broadcast_to(mask, w.shape)
    assert np.all(w[~full] == 0)
    assert np.all(w[full] > 0)
    has_key = full.any(axis=-1)
    np.testing.assert_allclose(w.sum(axis=-1)[has_key], 1.0, rtol=0, atol=1e-12)
    assert np.all(w[1, :, 2] == 0) and np.all(out[1, :, 2] == 0)     # the all-masked row: zeros, no NaN
    assert np.all(np.isfinite(out))


def test_additive_attention_gradcheck_with_padding(float64, rng):
    att = L.AdditiveAttention(Dk, Dh)
    mask = mt.masks.padding_mask(padded_ids(rng, B, Tk), 0)
    gradcheck(att, *qkv(rng), mask)


def test_additive_attention_gradcheck_with_a_fully_masked_row_and_band(float64, rng):
    att = L.AdditiveAttention(Dk, Dh)
    q, k, v = qkv(rng)
    mask = np.ones((B, 1, Tq, Tk), dtype=bool) & mt.to_numpy(mt.masks.local_mask(Tk, 1))[..., :Tq, :]
    mask[2, 0, 1] = False
    gradcheck(att, q, k, v, mask)


def test_additive_attention_gradcheck_self_attention_unmasked(float64, rng):
    att = L.AdditiveAttention(Dk, Dh)
    x = rng.standard_normal((B, H, Tk, Dk))
    gradcheck(att, x, x.copy(), x.copy(), None)


# --- ScaledDotProductAttention(scale=False) ---------------------------------------------------------

@pytest.mark.parametrize("scale", [False, True])
def test_scale_switch(float64, rng, scale):
    q = rng.standard_normal((B, H, Tq, Dk)) * 3
    k = rng.standard_normal((B, H, Tk, Dk)) * 3
    v = rng.standard_normal((B, H, Tk, Dv))
    out = L.ScaledDotProductAttention(scale=scale)(q, k, v)
    s = q @ k.swapaxes(-1, -2) / (math.sqrt(Dk) if scale else 1.0)
    np.testing.assert_allclose(out, softmax(s) @ v, rtol=0, atol=1e-12)
    other = L.ScaledDotProductAttention(scale=not scale)(q, k, v)
    assert np.abs(other - out).max() > 1e-3                # the switch changes something


def test_unscaled_attention_gradcheck_with_padding_and_causal_mask(float64, rng):
    q, k, v = (rng.standard_normal((B, H, Tk, d)) for d in (Dk, Dk, Dv))
    mask = mt.masks.padding_mask(padded_ids(rng, B, Tk), 0) & mt.masks.subsequent_mask(Tk)
    gradcheck(L.ScaledDotProductAttention(scale=False), q, k, v, mask)


# --- PyTorch as a second oracle ---------------------------------------------------------------------

TOL = 1e-10


def test_rnn_matches_torch_rnn(float64, rng):
    torch = pytest.importorskip("torch")
    rnn = L.RNN(D)
    rnn.b.data[...] = rng.standard_normal(D)
    ref = torch.nn.RNN(D, D, nonlinearity="tanh", batch_first=True).double()
    with torch.no_grad():                                  # torch stores W as (out, in) and keeps two biases
        ref.weight_ih_l0.copy_(torch.tensor(rnn.W_x.data.T))
        ref.weight_hh_l0.copy_(torch.tensor(rnn.W_h.data.T))
        ref.bias_ih_l0.copy_(torch.tensor(rnn.b.data))
        ref.bias_hh_l0.zero_()
    x = rng.standard_normal((B, T, D))
    dout = rng.standard_normal((B, T, D))
    xt = torch.tensor(x, requires_grad=True)
    yt, _ = ref(xt)
    (yt * torch.tensor(dout)).sum().backward()
    np.testing.assert_allclose(rnn(x), yt.detach().numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(rnn.backward(dout), xt.grad.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(rnn.W_x.grad, ref.weight_ih_l0.grad.numpy().T, rtol=0, atol=TOL)
    np.testing.assert_allclose(rnn.W_h.grad, ref.weight_hh_l0.grad.numpy().T, rtol=0, atol=TOL)
    np.testing.assert_allclose(rnn.b.grad, ref.bias_ih_l0.grad.numpy(), rtol=0, atol=TOL)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_conv1d_matches_torch_conv1d(float64, rng, k):
    torch = pytest.importorskip("torch")
    conv = L.Conv1d(D, k)
    conv.b.data[...] = rng.standard_normal(D)
    x = rng.standard_normal((B, T, D))
    dout = rng.standard_normal((B, T, D))
    xt = torch.tensor(x, requires_grad=True)
    # torch's conv1d is a cross-correlation over (B, channels, T) with weight (out, in, k): W[j, c, o] -> w[o, c, j]
    wt = torch.tensor(conv.W.data.transpose(2, 1, 0).copy(), requires_grad=True)
    bt = torch.tensor(conv.b.data, requires_grad=True)
    yt = torch.nn.functional.conv1d(xt.transpose(1, 2), wt, bt, padding=k // 2).transpose(1, 2)
    (yt * torch.tensor(dout)).sum().backward()
    np.testing.assert_allclose(conv(x), yt.detach().numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(conv.backward(dout), xt.grad.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(conv.W.grad, wt.grad.numpy().transpose(2, 1, 0), rtol=0, atol=TOL)
    np.testing.assert_allclose(conv.b.grad, bt.grad.numpy(), rtol=0, atol=TOL)


def test_additive_attention_matches_torch_autograd(float64, rng):
    torch = pytest.importorskip("torch")
    att = L.AdditiveAttention(Dk, Dh)
    q, k, v = qkv(rng)
    mask = mt.to_numpy(mt.masks.padding_mask(padded_ids(rng, B, Tk), 0))
    dout = rng.standard_normal((B, H, Tq, Dv))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    Wq, Wk, va = (torch.tensor(p.data, requires_grad=True) for p in (att.W_q, att.W_k, att.v_a))
    hidden = torch.tanh((qt @ Wq)[..., :, None, :] + (kt @ Wk)[..., None, :, :])   # (B,H,Tq,Tk,Dh)
    scores = (hidden @ va).masked_fill(~torch.tensor(mask), float("-inf"))
    yt = torch.softmax(scores, dim=-1) @ vt
    (yt * torch.tensor(dout)).sum().backward()
    np.testing.assert_allclose(att(q, k, v, mask), yt.detach().numpy(), rtol=0, atol=TOL)
    dq, dk, dv = att.backward(dout)
    for ours, theirs in [(dq, qt), (dk, kt), (dv, vt), (att.W_q.grad, Wq), (att.W_k.grad, Wk), (att.v_a.grad, va)]:
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=0, atol=TOL)
