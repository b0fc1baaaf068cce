"""Skipping the padding (masks.Packing) changes nothing a loss can see.

The model runs its position-wise layers on the rows of the real tokens only. These tests hold that
against computations that keep every position: Packing's pack/unpack against plain indexing,
MultiHeadAttention on packed rows against the same layer on the padded grid (outputs and every
gradient), finite differences through packed attention, and the whole model on a padded batch against
each sentence run alone, with no padding at all (logits and the gradient of every parameter).
"""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.layers import MultiHeadAttention
from minitransformer.masks import Packing, padding_mask, subsequent_mask
from minitransformer.model import Transformer, TransformerConfig

PAD = 0
D, H = 12, 3


def padded_ids(rng, lengths, T, vocab=11):
    """(B,T) ids, sentence b real for its first lengths[b] positions, padding after."""
    ids = np.full((len(lengths), T), PAD)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(3, vocab, size=n)
    return ids


# -------------------------------------------------------------------------------------- pack, unpack

def test_pack_takes_the_real_tokens_in_reading_order_and_unpack_puts_them_back(rng):
    ids = padded_ids(rng, [4, 1, 0, 3], T=5)
    ids[3, 1] = PAD                                            # padding inside a sentence too
    rows = Packing(ids, PAD)
    assert rows.size == int((ids != PAD).sum()) == 7 and rows.shape == (4, 5)
    x = rng.standard_normal((4, 5, 6))
    packed = rows.pack(x)
    np.testing.assert_array_equal(packed, x[ids != PAD])       # boolean indexing reads in C order
    grid = rows.unpack(packed)
    assert grid.shape == (4, 5, 6)
    np.testing.assert_array_equal(grid[ids != PAD], x[ids != PAD])
    assert np.all(grid[ids == PAD] == 0)
    np.testing.assert_array_equal(rows.pack(ids), ids[ids != PAD])   # no trailing axes: (B,T) -> (N,)


def test_without_padding_pack_and_unpack_are_views(rng):
    ids = padded_ids(rng, [3, 3], T=3)
    rows = Packing(ids, PAD)
    assert rows.index is None and rows.size == 6
    x = rng.standard_normal((2, 3, 4))
    assert np.shares_memory(rows.pack(x), x) and rows.pack(x).shape == (6, 4)
    r = rng.standard_normal((6, 4))
    assert np.shares_memory(rows.unpack(r), r) and rows.unpack(r).shape == (2, 3, 4)


@pytest.mark.parametrize("ids", [np.zeros(5, dtype=int), np.zeros((2, 3)), [[1, 2]]])
def test_packing_rejects_what_is_not_a_2d_integer_array(ids):
    with pytest.raises(ValueError, match="Packing: ids must be a 2-D integer array"):
        Packing(ids, PAD)


@pytest.mark.parametrize("pad_id", [0.0, None, True, "0"])
def test_packing_rejects_a_pad_id_that_is_not_an_int(pad_id):
    with pytest.raises(TypeError, match="Packing: pad_id must be an int"):
        Packing(np.zeros((2, 3), dtype=int), pad_id)


# --------------------------------------------------------------------------- attention on packed rows

def attention_case(rng, cross):
    """Query ids (B,Tq), key ids (B,Tk), the mask the Transformer would build, and grid inputs."""
    q_ids = padded_ids(rng, [5, 2, 4], T=5)
    k_ids = padded_ids(rng, [3, 6, 1], T=6) if cross else q_ids
    mask = padding_mask(k_ids, PAD) if cross else padding_mask(q_ids, PAD) & subsequent_mask(5)
    query = rng.standard_normal((3, 5, D))
    key = rng.standard_normal((3, 6, D)) if cross else query
    return q_ids, k_ids, mask, query, key


@pytest.mark.parametrize("cross", [False, True])
def test_attention_on_packed_rows_equals_attention_on_the_grid(float64, rng, cross):
    q_ids, k_ids, mask, query, key = attention_case(rng, cross)
    q_rows, k_rows = Packing(q_ids, PAD), Packing(k_ids, PAD)
    mha = MultiHeadAttention(D, H)
    for p in mha.parameters():
        p.data += 0.3 * rng.standard_normal(p.data.shape)      # no bias at 0
    dout = rng.standard_normal((3, 5, D))
    dout[q_ids == PAD] = 0                                     # padded queries' outputs are read by nothing

    out = mha(query, key, key, mask)                           # the grid, every position computed
    grads = mha.backward(dout)
    param_grads = [p.grad.copy() for p in mha.parameters()]
    mha.zero_grad()

    packed_key = k_rows.pack(key)
    out_rows = mha(q_rows.pack(query), packed_key, packed_key, mask, (q_rows, k_rows))
    grad_rows = mha.backward(q_rows.pack(dout))

    np.testing.assert_allclose(out_rows, q_rows.pack(out), rtol=0, atol=1e-12)
    np.testing.assert_allclose(grad_rows[0], q_rows.pack(grads[0]), rtol=0, atol=1e-12)
    for g_rows, g in zip(grad_rows[1:], grads[1:]):
        np.testing.assert_allclose(g_rows, k_rows.pack(g), rtol=0, atol=1e-12)
    for p, expected in zip(mha.parameters(), param_grads):
        np.testing.assert_allclose(p.grad, expected, rtol=0, atol=1e-12)
        assert np.abs(expected).max() > 1e-6 or p is mha.W_k.b   # the key bias's gradient is 0 (softmax)


@pytest.mark.parametrize("cross", [False, True])
def test_attention_on_packed_rows_gradcheck(float64, rng, cross):
    q_ids, k_ids, mask, query, key = attention_case(rng, cross)
    q_rows, k_rows = Packing(q_ids, PAD), Packing(k_ids, PAD)
    packed_query, packed_key = q_rows.pack(query), k_rows.pack(key)
    value = packed_key if not cross else k_rows.pack(rng.standard_normal(key.shape))
    report = mt.gradcheck.check(MultiHeadAttention(D, H), packed_query, packed_key, value, mask,
                                (q_rows, k_rows), max_entries=30)
    report.assert_ok(1e-6)
    assert {"input[0]", "input[1]", "input[2]"} <= {r.name for r in report.rows}


def test_attention_checks_packed_shapes_and_the_packing(float64, rng):
    q_ids, k_ids, mask, query, key = attention_case(rng, cross=True)
    q_rows, k_rows = Packing(q_ids, PAD), Packing(k_ids, PAD)
    mha = MultiHeadAttention(D, H)
    with pytest.raises(ValueError, match=r"query is packed, so it must have shape \(N=11 real tokens"):
        mha(query, k_rows.pack(key), k_rows.pack(key), mask, (q_rows, k_rows))
    with pytest.raises(TypeError, match="packing must be a pair"):
        mha(query, key, key, mask, q_rows)


# ------------------------------------------------------------------ the model: a batch vs each alone

@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_batch_equals_each_sentence_alone(float64, rng, norm_first):
    """Logits at the real positions, and the gradient of every parameter, are those of running each
    sentence by itself with no padding anywhere (summed over the sentences, as the batch's are)."""
    cfg = TransformerConfig(11, 11, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                            d_ff=10, dropout=0.0, max_len=16, norm_first=norm_first)
    model = Transformer(cfg)
    for p in model.parameters():
        if p.data.ndim == 1:
            p.data += 0.3 * rng.standard_normal(p.data.shape)
    src_len, tgt_len = [6, 2, 4], [3, 5, 1]
    src, tgt_in = padded_ids(rng, src_len, T=7), padded_ids(rng, tgt_len, T=6)
    tgt_in[:, 0] = 1                                           # BOS
    dlogits = rng.standard_normal((3, 6, 11))
    dlogits[tgt_in == PAD] = 0                                 # as a loss that ignores padding gives

    logits = model(src, tgt_in)
    model.backward(dlogits)
    batch_grads = [p.grad.copy() for p in model.parameters()]
    assert all(np.abs(g).max() > 0 for g in batch_grads)

    model.zero_grad()
    for b in range(3):
        alone = model(src[b:b + 1, :src_len[b]], tgt_in[b:b + 1, :tgt_len[b]])   # (1, t, V), no padding
        np.testing.assert_allclose(logits[b, :tgt_len[b]], alone[0], rtol=0, atol=1e-12)
        model.backward(dlogits[b:b + 1, :tgt_len[b]])          # grads add up over the three sentences
    for p, expected in zip(model.parameters(), batch_grads):
        np.testing.assert_allclose(p.grad, expected, rtol=0, atol=1e-12)
    assert np.all(logits[tgt_in == PAD] == 0)                  # tied projection of a zero row
    memory = model.eval().encode(src)
    assert np.all(memory[src == PAD] == 0) and np.all(np.abs(memory[src != PAD]).max(axis=-1) > 0)
