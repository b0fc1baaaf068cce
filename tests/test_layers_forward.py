"""Forward semantics that a matching backward cannot vouch for: a wrong forward with its own
consistent backward would pass every gradient check, so the forward is tested against the math."""

import math

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L


def test_padding_mask_and_subsequent_mask_values():
    ids = np.array([[5, 6, 0], [7, 0, 0]])
    pm = mt.masks.padding_mask(ids, 0)
    assert pm.shape == (2, 1, 1, 3) and pm.dtype == bool
    assert pm[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    sm = mt.masks.subsequent_mask(4)
    assert sm.shape == (1, 1, 4, 4)
    assert sm[0, 0].tolist() == [[j <= i for j in range(4)] for i in range(4)]
    lm = mt.masks.local_mask(5, 1)
    assert lm.shape == (1, 1, 5, 5) and lm.dtype == bool
    assert lm[0, 0].tolist() == [[abs(i - j) <= 1 for j in range(5)] for i in range(5)]


def test_changing_a_padded_key_changes_no_output(float64, rng):
    mha = L.MultiHeadAttention(6, 3).eval()
    x = rng.standard_normal((2, 4, 6))
    memory = rng.standard_normal((2, 5, 6))
    ids = np.array([[4, 5, 6, 0, 0], [4, 5, 6, 7, 8]])
    mask = mt.masks.padding_mask(ids, 0)
    before = mha(x, memory, memory, mask).copy()
    memory2 = memory.copy()
    memory2[0, 3:] = rng.standard_normal((2, 6)) * 100   # rewrite the padded keys/values
    after = mha(x, memory2, memory2, mask)
    np.testing.assert_array_equal(before, after)
    assert np.all(mha.attn[0, :, :, 3:] == 0.0)            # exactly zero weight, not merely small


def test_causal_mask_changing_token_t_changes_nothing_before_t(float64, rng):
    T = 6
    mha = L.MultiHeadAttention(6, 2).eval()
    x = rng.standard_normal((1, T, 6))
    mask = mt.masks.subsequent_mask(T)
    base = mha(x, x, x, mask).copy()
    for t in range(T):
        x2 = x.copy()
        x2[0, t] += rng.standard_normal(6)
        out = mha(x2, x2, x2, mask)
        np.testing.assert_array_equal(out[0, :t], base[0, :t])
        assert not np.allclose(out[0, t], base[0, t])


def test_attention_rows_sum_to_one(float64, rng):
    sdpa = L.ScaledDotProductAttention().eval()
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    mask = mt.masks.subsequent_mask(4)
    sdpa(q, k, v, mask)
    np.testing.assert_allclose(sdpa.attn.sum(-1), 1.0, atol=1e-12)
    assert np.all(sdpa.attn[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)


@pytest.mark.parametrize("scale", [True, False])
def test_attention_equals_the_formula(float64, rng, scale):
    q, k, v = rng.standard_normal((1, 1, 3, 4)), rng.standard_normal((1, 1, 5, 4)), rng.standard_normal((1, 1, 5, 2))
    out = L.ScaledDotProductAttention(scale=scale).eval()(q, k, v)
    s = q[0, 0] @ k[0, 0].T / (2.0 if scale else 1.0)      # sqrt(d_k) = 2; scale=False: the unscaled comparison
    w = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    np.testing.assert_allclose(out[0, 0], w @ v[0, 0], rtol=1e-12)


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 2), (49, 5), (123, 9)])
def test_positional_encoding_values_match_the_paper(float64, pos, i):
    d = 20
    pe = L.PositionalEncoding(d, max_len=200)
    x = np.zeros((1, 200, d))
    out = pe(x)[0]
    angle = pos / 10000 ** (2 * i / d)
    assert out[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-12)
    assert out[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-12)


def test_positional_encoding_offset_is_the_same_table(float64, rng):
    pe = L.PositionalEncoding(8, max_len=30).eval()
    x = rng.standard_normal((2, 10, 8))
    np.testing.assert_array_equal(pe(x)[:, 4:7], pe(x[:, 4:7], offset=4))


def test_layernorm_zero_mean_unit_variance(float64, rng):
    ln = L.LayerNorm(9)
    x = rng.standard_normal((3, 4, 9)) * 5 + 2
    y = ln(x)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1, rtol=1e-5)     # eps=1e-5 inside the root: var = v/(v+eps)
    np.testing.assert_allclose(y.var(-1), x.var(-1) / (x.var(-1) + 1e-5), rtol=1e-12)


def test_softmax_stable_for_large_logits(float64):
    x = np.array([[1e4, 1e4 - 1.0, 1e4 - 2.0], [-1e4, 0.0, 1e4]])
    p = L.Softmax()(x)
    assert np.all(np.isfinite(p))
    e = np.exp([0.0, -1.0, -2.0])
    np.testing.assert_allclose(p[0], e / e.sum(), rtol=1e-12)
    np.testing.assert_allclose(p[1], [0, 0, 1], atol=1e-300)


def test_softmax_float32_large_logits_finite():
    p = L.Softmax()(np.array([[3e4, 1e4, -3e4]], dtype=np.float32))
    assert p.dtype == np.float32 and np.all(np.isfinite(p)) and p[0, 0] == 1.0


def test_dropout_keeps_expected_value_and_is_identity_in_eval():
    mt.manual_seed(5)
    drop = L.Dropout(0.3)
    x = np.ones((400, 500), dtype=np.float32)
    y = drop(x)
    kept = (y != 0).mean()
    assert abs(kept - 0.7) < 0.005                            # 200k draws: std of the mean ~0.001
    assert abs(y.mean() - 1.0) < 0.01                         # inverted dropout: E[out] = x
    np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
    drop.backward(np.ones_like(x))
    drop.eval()
    assert drop(x) is x


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_dropout_drops_exactly_the_draws_below_p(monkeypatch, p):
    # "Random" numbers that are (i + 0.5) / n for i = 0..n-1, once each: the mask must drop exactly the
    # round(p * n) smallest (a Bernoulli at exactly p), keep the rest and scale them by 1/(1-p).
    n = 1000

    class EvenlySpread:
        def random(self, shape):
            return ((np.arange(n) + 0.5) / n).reshape(shape)

    monkeypatch.setattr(mt.backend, "device_rng", lambda: EvenlySpread())
    y = L.Dropout(p)(np.ones((10, 100), dtype=np.float32))
    dropped = np.flatnonzero(y.reshape(-1) == 0)
    np.testing.assert_array_equal(dropped, np.arange(round(p * n)))
    np.testing.assert_allclose(y.reshape(-1)[round(p * n):], 1 / (1 - p), rtol=1e-6)


def test_dropout_is_reproducible_with_manual_seed():
    x = np.ones((5, 7), dtype=np.float32)
    mt.manual_seed(11)
    a = L.Dropout(0.5)(x)
    mt.manual_seed(11)
    b = L.Dropout(0.5)(x)
    np.testing.assert_array_equal(a, b)


def test_embedding_scale_and_lookup(rng):
    emb = L.Embedding(7, 4, scale=True)
    ids = np.array([[1, 6], [6, 0]])
    out = emb(ids)
    np.testing.assert_allclose(out[0, 1], emb.weight.data[6] * 2.0, rtol=1e-6)


def test_embedding_backward_adds_every_repeat(float64):
    emb = L.Embedding(5, 3)
    ids = np.array([[2, 2, 2], [1, 2, 4]])
    emb(ids)
    emb.backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(emb.weight.grad[:, 0], [0, 1, 4, 0, 1])


def test_relu_and_ffn_forward(float64, rng):
    x = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(L.ReLU()(x), np.maximum(x, 0))
    ffn = L.PositionwiseFeedForward(4, 5)
    expected = np.maximum(x @ ffn.W1.W.data + ffn.W1.b.data, 0) @ ffn.W2.W.data + ffn.W2.b.data
    np.testing.assert_allclose(ffn(x), expected, rtol=1e-12)


@pytest.mark.parametrize("make", [L.ReLU, lambda: L.Dropout(0.3), lambda: L.PositionwiseFeedForward(7, 9, 0.3)],
                         ids=["relu", "dropout", "ffn"])
def test_layers_leave_their_arguments_alone(make, float64, rng):
    # An in-place write into x or dout would corrupt an activation another layer has cached (a residual's x).
    x, dout = rng.standard_normal((3, 5, 7)), rng.standard_normal((3, 5, 7))
    x0, dout0 = x.copy(), dout.copy()
    layer = make()
    y = layer(x)
    dx = layer.backward(dout)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dout, dout0)
    assert not np.array_equal(y, x0) and not np.array_equal(dx, dout0)


def test_post_ln_sublayer_is_layernorm_of_the_residual_sum(float64, rng):
    x = rng.standard_normal((2, 3, 4))
    block = L.SublayerConnection(4)
    out = block(x, lambda h: 2 * h)
    mean, var = (3 * x).mean(-1, keepdims=True), (3 * x).var(-1, keepdims=True)
    np.testing.assert_allclose(out, (3 * x - mean) / np.sqrt(var + 1e-5), rtol=1e-10)
