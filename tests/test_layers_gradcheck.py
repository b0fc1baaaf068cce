"""Every layer's backward against central finite differences, in float64.

Bound: relative error < 1e-6 for every input and every parameter (mt.gradcheck.DEFAULT_TOLERANCE).
Shapes are odd and distinct (B=3, T=5, S=7, D=6, F=11, H=3) so that a transposed or mis-broadcast
gradient cannot pass by accident; batches carry padding and the causal mask where masks apply.
"""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L

BOUND = 1e-6
B, T, S, D, F, H = 3, 5, 7, 6, 11, 3


@pytest.fixture
def x(float64, rng):
    return rng.standard_normal((B, T, D))


def src_ids(rng):
    ids = rng.integers(3, 9, size=(B, S))
    ids[0, 4:] = 0          # padding at the end of two sentences
    ids[1, 6:] = 0
    return ids


def check(module, *inputs, **kw):
    report = mt.gradcheck.check(module, *inputs, **kw)
    report.assert_ok(BOUND)
    names = {r.name for r in report.rows}
    for name, _ in module.named_parameters():           # every parameter was checked
        assert name in names
    return report


@pytest.mark.parametrize("make", [
    lambda: L.Linear(D, 4),
    lambda: L.Linear(D, 4, bias=False),
    lambda: L.LayerNorm(D),
    lambda: L.Softmax(axis=-1),
    lambda: L.Softmax(axis=1),
    lambda: L.ReLU(),
    lambda: L.PositionwiseFeedForward(D, F),
    lambda: L.PositionalEncoding(D, max_len=20),
    lambda: L.LearnedPositionalEmbedding(9, D),
], ids=["linear", "linear_nobias", "layernorm", "softmax", "softmax_axis1", "relu", "ffn", "sinusoidal_pe",
        "learned_pe"])
def test_single_input_layers(make, x):
    mt.manual_seed(3)
    check(make(), x)


def test_layernorm_with_trained_gamma_beta(x, rng):
    ln = L.LayerNorm(D)
    ln.gamma.data[...] = mt.backend.asarray(rng.standard_normal(D))   # asarray: CuPy takes no host arrays here
    ln.beta.data[...] = mt.backend.asarray(rng.standard_normal(D))
    check(ln, x * 3 + 1)


def test_dropout_in_training_mode(x):
    drop = L.Dropout(0.4)                               # the check re-seeds: the same mask every forward
    report = check(drop, x)
    assert report.rows[0].checked == x.size


def test_ffn_with_dropout(x):
    check(L.PositionwiseFeedForward(D, F, dropout=0.3), x)


def test_embedding_with_repeated_ids(float64):
    emb = L.Embedding(10, D, scale=True)
    ids = np.array([[1, 1, 2, 9], [3, 1, 0, 0], [2, 2, 2, 2]])  # ids repeat within and across rows
    check(emb, ids)


def test_mask_layer(x, rng):
    scores = rng.standard_normal((B, H, T, S))
    mask = mt.masks.padding_mask(src_ids(rng), 0)
    check(L.Mask(), scores, mask)


def test_scaled_dot_product_attention_causal_and_padding(float64, rng):
    q = rng.standard_normal((B, H, T, 4))
    k = rng.standard_normal((B, H, T, 4))
    v = rng.standard_normal((B, H, T, 2))               # Dv != Dk
    ids = rng.integers(3, 9, size=(B, T))
    ids[2, 3:] = 0
    mask = mt.masks.padding_mask(ids, 0) & mt.masks.subsequent_mask(T)
    check(L.ScaledDotProductAttention(), q, k, v, mask)


def test_scaled_dot_product_attention_dropout(float64, rng):
    q, k, v = (rng.standard_normal((B, H, T, 4)) for _ in range(3))
    check(L.ScaledDotProductAttention(dropout=0.25), q, k, v, None)


def test_unscaled_dot_product_attention_local_mask(float64, rng):
    q, k, v = (rng.standard_normal((B, H, T, 4)) for _ in range(3))
    check(L.ScaledDotProductAttention(scale=False), q, k, v, mt.masks.local_mask(T, 1))


@pytest.mark.parametrize("d_k, d_v", [(None, None), (2, 5)], ids=["d_k_default", "d_k_2_d_v_5"])
def test_multi_head_self_attention_causal(x, rng, d_k, d_v):
    ids = rng.integers(3, 9, size=(B, T))
    ids[0, 3:] = 0
    mask = mt.masks.padding_mask(ids, 0) & mt.masks.subsequent_mask(T)
    mha = L.MultiHeadAttention(D, H, d_k=d_k, d_v=d_v)
    check(mha, x, x.copy(), x.copy(), mask)


@pytest.mark.parametrize("d_k, d_v", [(None, None), (5, None), (5, 2)], ids=["d_k_default", "d_k_5", "d_k_5_d_v_2"])
def test_multi_head_cross_attention_padding(x, rng, d_k, d_v):
    memory = rng.standard_normal((B, S, D))               # Tk = S != Tq = T
    mha = L.MultiHeadAttention(D, H, dropout=0.2, d_k=d_k, d_v=d_v)   # d_k=5: D -> H*Dk = 15; d_v=2: D -> 6 -> D
    check(mha, x, memory, memory.copy(), mt.masks.padding_mask(src_ids(rng), 0))


def test_multi_head_attention_fully_masked_row_has_zero_weight_and_gradient(float64, rng):
    x = rng.standard_normal((2, 4, D))
    mask = np.ones((2, 1, 1, 4), dtype=bool)
    mask[1] = False                                      # every key of sentence 1 masked
    mha = L.MultiHeadAttention(D, 2)
    check(mha, x, x.copy(), x.copy(), mask)
    mha.eval()
    x, mask = mt.backend.asarray(x), mt.backend.asarray(mask)    # on the active backend (CuPy under gpu.sh)
    mha(x, x, x, mask)
    attn = mt.to_numpy(mha.attn)
    assert np.all(attn[1] == 0) and np.all(np.isfinite(attn))


class _Block(mt.Module):
    """SublayerConnection around a feed-forward network, as the encoder uses it."""

    def __init__(self, norm_first, dropout):
        super().__init__()
        self.ffn = L.PositionwiseFeedForward(D, F)
        self.sublayer = L.SublayerConnection(D, dropout=dropout, norm_first=norm_first)

    def forward(self, x):
        return self.sublayer.forward(x, self.ffn.forward)

    def backward(self, dout):
        return self.sublayer.backward(dout, self.ffn.backward)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_sublayer_connection(x, norm_first):
    check(_Block(norm_first, dropout=0.3), x)


def test_tolerance_catches_a_wrong_backward(x):
    """The check must be able to fail: a LayerNorm whose backward forgets the mean term."""

    class BrokenLayerNorm(L.LayerNorm):
        def backward(self, dout):
            dx = super().backward(dout)
            return dx + 1e-3 * dout

    report = mt.gradcheck.check(BrokenLayerNorm(D), x)
    assert not report.ok
    with pytest.raises(AssertionError, match=r"input\[0\]"):
        report.assert_ok(BOUND)


def test_report_reads_as_a_table(x):
    text = str(mt.gradcheck.check(L.Linear(D, 4), x))
    assert "input[0]" in text and "W" in text and "PASS" in text
    assert "<table>" in mt.gradcheck.check(L.Linear(D, 4), x)._repr_html_()


def test_same_array_passed_as_several_inputs_is_checked_input_by_input(x):
    """check(mha, x, x, x) must treat query, key and value as separate inputs (and leave x unchanged)."""
    before = x.copy()
    check(L.MultiHeadAttention(D, H), x, x, x, mt.masks.subsequent_mask(T))
    np.testing.assert_array_equal(x, before)
