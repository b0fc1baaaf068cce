"""Property-based tests (hypothesis) of input validation at every public entry point.

Two properties, for every entry point:
- a rejected input raises ValueError or TypeError (exactly those types: never a bare IndexError, a NumPy
  broadcasting error or a KeyError from deep inside) whose message names the argument;
- an accepted input gives finite outputs of the documented shape.

Sizes are tiny and example counts small, so the whole file runs in seconds. ``TABLE`` at the end lists one
representative bad input per argument; it is tested too, and ``validation_table()`` renders it as Markdown.
"""

import functools
import json
import math
import re
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitransformer as mt
from minitransformer import (
    batching,
    bleu,
    datasets,
    decoding,
    gradcheck,
    masks,
    optim,
    tokenizers,
)
from minitransformer import layers as L

FAST = settings(max_examples=30, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=12)     # the few properties that run a whole model per example

NAN, INF = float("nan"), float("inf")


def rejects(call, *names, exc=(ValueError, TypeError)):
    """call() must raise exactly one of exc, with a message naming every one of names. -> the error.

    A name that is an identifier must appear as a whole word ("x" is not found in "max_len", "src" not in
    "src_vocab_size"); other strings ("max_len=6", "[0, ") just have to appear."""
    with pytest.raises(Exception) as info:
        call()
    err = info.value
    assert type(err) in exc, f"expected {[e.__name__ for e in exc]}, got {type(err).__name__}: {err}"
    for name in names:
        found = re.search(rf"\b{re.escape(name)}\b", str(err)) if name.isidentifier() else name in str(err)
        assert found, f"the message does not name {name!r}: {err}"
    return err


def finite(x) -> bool:
    return bool(np.isfinite(mt.to_numpy(x)).all())


# -------------------------------------------------------------------------- strategies of bad values

def not_a_positive_int():
    """What a size (d_model, num_heads, max_len, beam_size, ...) must refuse."""
    return st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.booleans(),
                     st.text(max_size=2), st.none(), st.just([4]))


def not_a_probability():
    """What a dropout rate or label smoothing must refuse: outside [0, 1), nan, or not a number."""
    return st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0), st.just(NAN),
                     st.booleans(), st.text(max_size=2), st.none())


def not_a_positive_number():
    """What an lr, an epsilon or a tolerance must refuse: <= 0, nan, inf, or not a number."""
    return st.one_of(st.floats(max_value=0.0), st.just(INF), st.just(NAN), st.booleans(),
                     st.text(max_size=2), st.none())


def not_a_non_negative_number():
    return st.one_of(st.floats(max_value=0.0, exclude_max=True), st.just(INF), st.just(NAN), st.booleans(),
                     st.text(max_size=2), st.none())


def seeds():
    return st.integers(0, 2**32 - 1)


def floats_array(seed, shape, dtype=np.float64, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# ============================================================================================= layers

CONSTRUCTORS = {
    "Linear": (L.Linear, {"in_features": 3, "out_features": 5}),
    "Embedding": (L.Embedding, {"num_embeddings": 7, "d_model": 4}),
    "PositionalEncoding": (L.PositionalEncoding, {"d_model": 4, "max_len": 6}),
    "LearnedPositionalEmbedding": (L.LearnedPositionalEmbedding, {"max_len": 6, "d_model": 4}),
    "LayerNorm": (L.LayerNorm, {"d_model": 4}),
    "PositionwiseFeedForward": (L.PositionwiseFeedForward, {"d_model": 4, "d_ff": 6}),
    "MultiHeadAttention": (L.MultiHeadAttention, {"d_model": 4, "num_heads": 2}),
}
SIZE_ARGUMENTS = [(cls, arg) for cls, (_, good) in CONSTRUCTORS.items() for arg in good]


@pytest.mark.parametrize("cls,arg", SIZE_ARGUMENTS, ids=[f"{c}.{a}" for c, a in SIZE_ARGUMENTS])
@FAST
@given(bad=not_a_positive_int())
def test_layer_sizes_must_be_positive_ints(cls, arg, bad):
    make, good = CONSTRUCTORS[cls]
    rejects(lambda: make(**{**good, arg: bad}), arg)


DROPOUT_ARGUMENTS = [
    ("Dropout", lambda p: L.Dropout(p), "p"),
    ("PositionwiseFeedForward", lambda p: L.PositionwiseFeedForward(4, 6, dropout=p), "dropout"),
    ("MultiHeadAttention", lambda p: L.MultiHeadAttention(4, 2, dropout=p), "dropout"),
    ("ScaledDotProductAttention", lambda p: L.ScaledDotProductAttention(dropout=p), "p"),
    ("SublayerConnection", lambda p: L.SublayerConnection(4, dropout=p), "dropout"),
]


@pytest.mark.parametrize("make,arg", [(m, a) for _, m, a in DROPOUT_ARGUMENTS], ids=[n for n, _, _ in DROPOUT_ARGUMENTS])
@FAST
@given(bad=not_a_probability())
def test_dropout_rates_must_be_in_unit_interval(make, arg, bad):
    rejects(lambda: make(bad), arg)


@FAST
@given(bad=not_a_positive_number())
def test_layernorm_eps_must_be_positive_and_finite(bad):
    rejects(lambda: L.LayerNorm(4, eps=bad), "eps")


@FAST
@given(d_model=st.integers(1, 12), num_heads=st.integers(1, 12))
def test_heads_must_divide_d_model(d_model, num_heads):
    if d_model % num_heads:
        rejects(lambda: L.MultiHeadAttention(d_model, num_heads), "d_model", "num_heads")
    else:
        assert L.MultiHeadAttention(d_model, num_heads).d_k == d_model // num_heads


@FAST
@given(lead=st.lists(st.integers(1, 3), max_size=3), d_in=st.integers(1, 5), d_out=st.integers(1, 5),
       dtype=st.sampled_from([np.float32, np.float64]), seed=seeds())
def test_linear_accepts_any_leading_shape(lead, d_in, d_out, dtype, seed):
    layer = L.Linear(d_in, d_out)
    x = floats_array(seed, (*lead, d_in), dtype)
    out = layer(x)
    assert out.shape == (*lead, d_out) and finite(out)
    dx = layer.backward(np.ones_like(out))
    assert dx.shape == x.shape and finite(dx)


@FAST
@given(d_in=st.integers(1, 5), wrong=st.integers(1, 6), seed=seeds())
def test_linear_rejects_wrong_feature_size_and_non_float_input(d_in, wrong, seed):
    layer = L.Linear(d_in, 2)
    assume(wrong != d_in)
    rejects(lambda: layer(floats_array(seed, (2, wrong))), "x", str(d_in))
    rejects(lambda: layer(np.zeros((2, d_in), dtype=np.int64)), "x")
    rejects(lambda: layer([[0.0] * d_in]), "x")
    assert layer(floats_array(seed, (2, d_in))).shape == (2, 2)   # a rejected call leaves the layer usable


@FAST
@given(V=st.integers(1, 9), shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data())
def test_embedding_ids_in_range_accepted_others_rejected(V, shape, data):
    emb = L.Embedding(V, 4)
    emb.eval()
    dtype = data.draw(st.sampled_from([np.int8, np.int32, np.int64, np.uint8]))
    ids = data.draw(hnp.arrays(dtype, shape, elements=st.integers(0, V - 1)))
    out = emb(ids)
    assert out.shape == (*shape, 4) and finite(out)
    bad = ids.astype(np.int64).copy()
    bad.flat[data.draw(st.integers(0, bad.size - 1))] = data.draw(st.one_of(st.integers(-1000, -1),
                                                                             st.integers(V, V + 1000)))
    rejects(lambda: emb(bad), "ids", str(V))
    rejects(lambda: emb(ids.astype(np.float64)), "ids")
    rejects(lambda: emb(ids.astype(bool)), "ids")
    rejects(lambda: emb(ids.tolist()), "ids")


@pytest.mark.parametrize("make", [lambda: L.PositionalEncoding(4, max_len=6), lambda: L.LearnedPositionalEmbedding(6, 4)],
                         ids=["sinusoidal", "learned"])
@FAST
@given(B=st.integers(1, 3), T=st.integers(1, 8), offset=st.integers(-2, 8), seed=seeds())
def test_positional_length_and_offset(make, B, T, offset, seed):
    layer = make()
    layer.eval()
    x = floats_array(seed, (B, T, 4), np.float32)
    if 0 <= offset and offset + T <= 6:
        out = layer(x, offset=offset)
        assert out.shape == x.shape and finite(out)
    else:
        rejects(lambda: layer(x, offset=offset), "max_len=6", "offset")
    rejects(lambda: layer(x[0, 0]), "x")                          # 1-D: no position axis
    rejects(lambda: layer(x[..., :3]), "x")                        # wrong d_model
    rejects(lambda: layer(x, offset=1.5), "offset")
    rejects(lambda: layer(x.tolist()), "x")


@FAST
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), p=st.floats(0.0, 0.95), seed=seeds())
def test_dropout_accepts_float_arrays_and_keeps_the_mean(shape, p, seed):
    layer = L.Dropout(p)
    x = floats_array(seed, shape) + 3.0
    out = layer(x)
    assert out.shape == x.shape and finite(out)
    kept = out != 0
    np.testing.assert_allclose(out[kept], x[kept] / (1.0 - p), rtol=1e-12)   # inverted dropout: scaled by 1/(1-p)
    layer.backward(np.ones_like(out))
    layer.eval()
    assert layer(x) is x
    rejects(lambda: layer(np.ones(shape, dtype=np.int64)), "x")
    rejects(lambda: layer(x.tolist()), "x")


@FAST
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=3), D=st.integers(1, 6), seed=seeds(),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_layernorm_output_is_normalised(lead, D, seed, scale):
    layer = L.LayerNorm(D)
    x = floats_array(seed, (*lead, D), scale=scale)
    out = layer(x)
    assert out.shape == x.shape and finite(out)
    if D > 1:
        np.testing.assert_allclose(out.mean(axis=-1), 0.0, atol=1e-6)
    layer.backward(np.ones_like(out))
    rejects(lambda: layer(np.zeros((*lead, D + 1))), "x", str(D))
    rejects(lambda: layer(np.zeros((*lead, D), dtype=np.int32)), "x")


@FAST
@given(B=st.integers(1, 3), T=st.integers(1, 4), seed=seeds())
def test_feedforward_shapes(B, T, seed):
    ffn = L.PositionwiseFeedForward(4, 6, dropout=0.2)
    x = floats_array(seed, (B, T, 4), np.float32)
    out = ffn(x)
    assert out.shape == (B, T, 4) and finite(out)
    assert ffn.backward(np.ones_like(out)).shape == x.shape
    rejects(lambda: ffn(x[..., :3]), "x")


def mask_for(kind, rng, B, H, Tq, Tk):
    """A boolean mask of one of the shapes that broadcast against scores (B,H,Tq,Tk)."""
    shape = {"padding": (B, 1, 1, Tk), "causal": (1, 1, Tq, Tk), "full": (B, H, Tq, Tk), "per_query": (B, 1, Tq, Tk)}[kind]
    return rng.random(shape) < 0.6                            # may mask every key of a row


@FAST
@given(B=st.integers(1, 3), Tq=st.integers(1, 4), Tk=st.integers(1, 4), H=st.sampled_from([1, 2, 4]),
       kind=st.sampled_from(["none", "padding", "causal", "full", "per_query"]), seed=seeds())
def test_multihead_attention_accepts_broadcastable_masks(B, Tq, Tk, H, kind, seed):
    rng = np.random.default_rng(seed)
    mha = L.MultiHeadAttention(8, H)
    q, kv = floats_array(seed, (B, Tq, 8), np.float32), floats_array(seed + 1, (B, Tk, 8), np.float32)
    mask = None if kind == "none" else mask_for(kind, rng, B, H, Tq, Tk)
    out = mha(q, kv, kv, mask)
    assert out.shape == (B, Tq, 8) and finite(out)
    attn = mt.to_numpy(mha.attn)
    assert attn.shape == (B, H, Tq, Tk)
    sums = attn.sum(axis=-1)                                  # 1, or 0 for a query with every key masked
    assert np.all(np.isclose(sums, 1.0, atol=1e-5) | (sums == 0.0))
    if mask is not None:
        assert np.all(attn[~np.broadcast_to(mask, attn.shape)] == 0.0)   # masked keys get exactly 0 weight
    grads = mha.backward(np.ones_like(out))
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape] and all(finite(g) for g in grads)


@FAST
@given(B=st.integers(1, 3), Tq=st.integers(1, 4), Tk=st.integers(1, 4), seed=seeds(),
       bad=st.sampled_from(["int", "float", "list", "wrong_Tk", "wrong_B", "rank5"]))
def test_multihead_attention_rejects_bad_masks_before_running(B, Tq, Tk, seed, bad):
    mha = L.MultiHeadAttention(4, 2)
    q, kv = floats_array(seed, (B, Tq, 4), np.float32), floats_array(seed, (B, Tk, 4), np.float32)
    good = np.ones((B, 1, 1, Tk), dtype=bool)
    mask = {"int": good.astype(np.int64), "float": good.astype(np.float32), "list": good.tolist(),
            "wrong_Tk": np.ones((B, 1, 1, Tk + 1), dtype=bool), "wrong_B": np.ones((B + 1, 1, 1, Tk), dtype=bool),
            "rank5": np.ones((1, B, 1, 1, Tk), dtype=bool)}[bad]
    rejects(lambda: mha(q, kv, kv, mask), "mask")
    out = mha(q, kv, kv, good)            # in training mode: the failed call left no forward waiting for backward
    mha.backward(np.ones_like(out))


@FAST
@given(B=st.integers(1, 3), T=st.integers(1, 4), seed=seeds())
def test_multihead_attention_rejects_bad_query_key_value(B, T, seed):
    mha = L.MultiHeadAttention(4, 2)
    x = floats_array(seed, (B, T, 4), np.float32)
    rejects(lambda: mha(x[0], x, x), "query")                           # rank 2
    rejects(lambda: mha(x, x[..., :2], x), "key")                       # wrong d_model
    rejects(lambda: mha(x, x, np.concatenate([x, x], axis=1)), "key", "value")   # Tk differs
    rejects(lambda: mha(x, np.concatenate([x, x]), np.concatenate([x, x])), "query", "key")   # batch differs
    rejects(lambda: mha(x.tolist(), x, x), "query")
    rejects(lambda: mha(x, x, x.astype(np.int64)), "value")


@FAST
@given(Tq=st.integers(1, 3), Tk=st.integers(1, 3), d=st.integers(1, 3), seed=seeds())
def test_scaled_dot_product_attention_shapes(Tq, Tk, d, seed):
    sdpa = L.ScaledDotProductAttention()
    sdpa.eval()
    q, k, v = (floats_array(seed + i, shape) for i, shape in enumerate([(2, 1, Tq, d), (2, 1, Tk, d), (2, 1, Tk, 3)]))
    out = sdpa(q, k, v)
    assert out.shape == (2, 1, Tq, 3) and finite(out)
    rejects(lambda: sdpa(q, np.zeros((2, 1, Tk, d + 1)), v), "q", "k")
    rejects(lambda: sdpa(q, k, np.zeros((2, 1, Tk + 1, 3))), "k", "v")
    rejects(lambda: sdpa(q, k[:1], v[:1]), "q", "k", "v")
    rejects(lambda: sdpa(q, k, v, np.ones((2, 1, Tq, Tk + 1), dtype=bool)), "mask")


@FAST
@given(axis=st.integers(-5, 5), ndim=st.integers(1, 3), seed=seeds())
def test_softmax_axis(axis, ndim, seed):
    x = floats_array(seed, (2,) * ndim)
    layer = L.Softmax(axis=axis)
    layer.eval()
    if -ndim <= axis < ndim:
        p = layer(x)
        assert p.shape == x.shape and finite(p)
        np.testing.assert_allclose(p.sum(axis=axis), 1.0)
    else:
        rejects(lambda: layer(x), "axis")
    rejects(lambda: L.Softmax(axis=1.0), "axis")


# ============================================================================================== masks

@FAST
@given(ids=hnp.arrays(st.sampled_from([np.int32, np.int64, np.uint8]), hnp.array_shapes(min_dims=2, max_dims=2, max_side=5),
                      elements=st.integers(0, 4)),
       pad_id=st.integers(0, 4))
def test_padding_mask(ids, pad_id):
    m = masks.padding_mask(ids, pad_id)
    assert m.shape == (ids.shape[0], 1, 1, ids.shape[1]) and m.dtype == bool
    np.testing.assert_array_equal(m[:, 0, 0], ids != pad_id)
    rejects(lambda: masks.padding_mask(ids.astype(np.float64), pad_id), "ids")
    rejects(lambda: masks.padding_mask(ids[0], pad_id), "ids")
    rejects(lambda: masks.padding_mask(ids[None], pad_id), "ids")
    rejects(lambda: masks.padding_mask(ids.tolist(), pad_id), "ids")
    rejects(lambda: masks.padding_mask(ids, float(pad_id)), "pad_id")


@FAST
@given(T=st.integers(1, 6), numpy_int=st.booleans())
def test_subsequent_mask(T, numpy_int):
    m = masks.subsequent_mask(np.int64(T) if numpy_int else T)
    assert m.shape == (1, 1, T, T) and m.dtype == bool
    np.testing.assert_array_equal(m[0, 0], np.tril(np.ones((T, T), dtype=bool)))


@FAST
@given(bad=not_a_positive_int())
def test_subsequent_mask_rejects(bad):
    rejects(lambda: masks.subsequent_mask(bad), "T must")


# ====================================================================================== configuration

CONFIG = {"src_vocab_size": 11, "tgt_vocab_size": 13, "d_model": 8, "num_heads": 2, "num_encoder_layers": 1,
          "num_decoder_layers": 1, "d_ff": 16, "dropout": 0.1, "max_len": 7}
INT_FIELDS = ["src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
              "num_decoder_layers", "d_ff", "max_len"]


@pytest.mark.parametrize("field", INT_FIELDS)
@FAST
@given(bad=not_a_positive_int())
def test_config_sizes(field, bad):
    rejects(lambda: mt.TransformerConfig(**{**CONFIG, field: bad}), field)


@FAST
@given(bad=not_a_probability())
def test_config_dropout(bad):
    rejects(lambda: mt.TransformerConfig(**{**CONFIG, "dropout": bad}), "dropout")


@FAST
@given(pad=st.integers(-3, 14), bos=st.integers(-3, 14), eos=st.integers(-3, 14))
def test_config_special_ids(pad, bos, eos):
    ids = {"pad_id": pad, "bos_id": bos, "eos_id": eos}
    outside = [name for name, v in ids.items() if not 0 <= v < 11]       # 11: the smaller vocabulary
    if outside:
        rejects(lambda: mt.TransformerConfig(**CONFIG, **ids), outside[0])
    elif len({pad, bos, eos}) < 3:
        rejects(lambda: mt.TransformerConfig(**CONFIG, **ids), "pad_id", "bos_id", "eos_id")
    else:
        assert mt.TransformerConfig(**CONFIG, **ids).pad_id == pad


@FAST
@given(d_model=st.integers(1, 16), num_heads=st.integers(1, 16))
def test_config_d_model_heads(d_model, num_heads):
    make = functools.partial(mt.TransformerConfig, **{**CONFIG, "d_model": d_model, "num_heads": num_heads})
    if d_model % num_heads:
        rejects(make, "d_model", "num_heads")
    elif d_model % 2:
        rejects(make, "d_model")
    else:
        cfg = make()
        assert mt.TransformerConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("field", ["share_embeddings", "tie_output", "norm_first"])
@FAST
@given(bad=st.one_of(st.integers(), st.text(max_size=2), st.none()))
def test_config_switches_must_be_bools(field, bad):
    rejects(lambda: mt.TransformerConfig(**{**CONFIG, field: bad}), field)


def test_config_shared_embeddings_need_one_vocabulary():
    rejects(lambda: mt.TransformerConfig(**{**CONFIG, "share_embeddings": True}), "share_embeddings",
            "src_vocab_size", "tgt_vocab_size")


@FAST
@given(name=st.one_of(st.text(max_size=6), st.none(), st.integers(), st.just(["tiny"])))
def test_config_preset_names(name):
    assume(name not in mt.TransformerConfig.presets())
    rejects(lambda: mt.TransformerConfig.preset(name, src_vocab_size=5, tgt_vocab_size=5), "name")


@pytest.mark.parametrize("name", ["tiny", "small", "base"])
def test_config_preset_needs_vocabularies(name):
    rejects(lambda: mt.TransformerConfig.preset(name), "src_vocab_size", "tgt_vocab_size")
    rejects(lambda: mt.TransformerConfig.preset(name, src_vocab_size=5, tgt_vocab_size=0), "tgt_vocab_size")
    assert mt.TransformerConfig.preset(name, src_vocab_size=5, tgt_vocab_size=6).tgt_vocab_size == 6


@FAST
@given(data=st.one_of(st.lists(st.text(max_size=3), max_size=3), st.text(max_size=3), st.none(), st.integers()))
def test_config_from_dict_needs_a_dict(data):
    rejects(lambda: mt.TransformerConfig.from_dict(data), "data")


@FAST
@given(key=st.text(string.ascii_lowercase, min_size=1, max_size=8))
def test_config_from_dict_names_unknown_keys(key):
    assume(key not in CONFIG and key not in mt.TransformerConfig(**CONFIG).to_dict())
    rejects(lambda: mt.TransformerConfig.from_dict({**CONFIG, key: 1}), key)


# ============================================================================================== model

@functools.cache
def tiny_model():
    """One small model for every inference property (eval mode: forwards need no backward)."""
    mt.manual_seed(0)
    return mt.Transformer(mt.TransformerConfig(**CONFIG)).eval()


def token_ids(V, B=None, B_max=3, T_max=7):
    """(B,T) integer arrays of ids in [0, V), of several integer dtypes, as arrays or nested lists."""
    rows = st.just(B) if B is not None else st.integers(1, B_max)
    arrays = hnp.arrays(st.sampled_from([np.int16, np.int32, np.int64, np.uint8]),
                        st.tuples(rows, st.integers(1, T_max)), elements=st.integers(0, V - 1))
    return st.one_of(arrays, arrays.map(lambda a: a.tolist()))


@SLOW
@given(data=st.data())
def test_transformer_accepts_valid_ids(data):
    model = tiny_model()
    src = data.draw(token_ids(11))                             # may be all padding: every key masked
    B = np.shape(src)[0]
    tgt = data.draw(token_ids(13, B=B))
    logits = model(src, tgt)
    assert logits.shape == (B, np.shape(tgt)[1], 13) and finite(logits)


def test_transformer_training_step_on_padding_is_finite():
    mt.manual_seed(0)
    model = mt.Transformer(mt.TransformerConfig(**CONFIG))
    src = np.array([[0, 0, 0], [4, 5, 0]])                      # one source of pure padding
    tgt_in, tgt_out = np.array([[1, 0], [1, 6]]), np.array([[0, 0], [6, 2]])
    loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    loss = loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    assert math.isfinite(loss) and all(finite(p.grad) for p in model.parameters())


def bad_ids(V, max_len):
    """(label, value, words the message must hold) for token ids a model must refuse; V: the larger vocabulary."""
    good = np.array([[3, 4, 0], [5, 6, 7]])
    return st.one_of(
        st.tuples(st.just("out of range"), st.integers(V, V + 100).map(lambda v: np.array([[3, v]])), st.just(["[0, "])),
        st.tuples(st.just("negative"), st.integers(-100, -1).map(lambda v: np.array([[v, 3]])), st.just([])),
        st.tuples(st.just("float"), st.just(good.astype(np.float32)), st.just(["dtype"])),
        st.tuples(st.just("bool"), st.just(good > 3), st.just(["dtype"])),
        st.tuples(st.just("rank 1"), st.just(good[0]), st.just(["2-D"])),
        st.tuples(st.just("rank 3"), st.just(good[None]), st.just(["2-D"])),
        st.tuples(st.just("empty batch"), st.just(np.zeros((0, 3), dtype=np.int64)), st.just(["non-empty"])),
        st.tuples(st.just("empty sentence"), st.just(np.zeros((2, 0), dtype=np.int64)), st.just(["non-empty"])),
        st.tuples(st.just("empty list"), st.just([]), st.just([])),
        st.tuples(st.just("empty row list"), st.just([[]]), st.just(["non-empty"])),
        st.tuples(st.just("too long"), st.integers(max_len + 1, max_len + 5).map(lambda n: np.ones((2, n), dtype=int)),
                  st.just([f"max_len={max_len}"])),
        st.tuples(st.just("ragged"), st.just([[3, 4], [5]]), st.just(["rectangular"])),
        st.tuples(st.just("str"), st.just("3 4 5"), st.just([])),
        st.tuples(st.just("None"), st.none(), st.just([])),
        st.tuples(st.just("floats in a list"), st.just([[3.0, 4.0]]), st.just(["dtype"])),
    )


@FAST
@given(case=bad_ids(13, 7), side=st.sampled_from(["src", "tgt_in"]))
def test_transformer_rejects_bad_ids(case, side):
    model = tiny_model()
    _, bad, words = case
    good = np.array([[3, 4, 5]])
    args = (bad, good) if side == "src" else (good, bad)
    rejects(lambda: model(*args), side, *words)


@FAST
@given(B_src=st.integers(1, 3), B_tgt=st.integers(1, 3))
def test_transformer_batch_sizes_must_match(B_src, B_tgt):
    model = tiny_model()
    src, tgt = np.full((B_src, 3), 4), np.full((B_tgt, 2), 5)
    if B_src == B_tgt:
        assert model(src, tgt).shape == (B_src, 2, 13)
    else:
        rejects(lambda: model(src, tgt), "src", "tgt_in", "batch")


def test_transformer_training_mode_rejection_leaves_model_usable():
    mt.manual_seed(0)
    model = mt.Transformer(mt.TransformerConfig(**CONFIG))
    src, tgt = np.array([[3, 4]]), np.array([[1, 5]])
    rejects(lambda: model(src, np.array([[1, 13]])), "tgt_in")
    logits = model(src, tgt)                                  # no "forward called twice" from the failed call
    rejects(lambda: model.backward(np.zeros((1, 3, 13))), "dlogits")
    rejects(lambda: model.backward(np.zeros((1, 2, 13)).tolist()), "dlogits")
    model.backward(np.zeros_like(logits))
    rejects(lambda: model.decode(tgt, [[0.0] * 8]), "memory")
    rejects(lambda: model.decode(tgt, np.zeros((2, 2, 8), dtype=np.float32)), "memory")


def test_transformer_needs_a_config():
    rejects(lambda: mt.Transformer(CONFIG), "config")


# =============================================================================================== loss

@FAST
@given(shape=hnp.array_shapes(min_dims=1, max_dims=2, max_side=4), V=st.integers(1, 6), eps=st.floats(0.0, 0.9),
       scale=st.sampled_from([1.0, 1e3]), dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_cross_entropy_accepts_valid_targets(shape, V, eps, scale, dtype, data):
    loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=eps)
    logits = floats_array(data.draw(seeds()), (*shape, V), dtype, scale)
    target = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(0, V - 1)))
    loss = loss_fn(logits, target)
    assert isinstance(loss, float) and math.isfinite(loss) and loss >= -1e-6
    dlogits = loss_fn.backward()
    assert dlogits.shape == logits.shape and finite(dlogits)
    np.testing.assert_allclose(dlogits.sum(axis=-1), 0.0, atol=1e-5)   # probabilities minus a distribution


@FAST
@given(V=st.integers(1, 6), data=st.data())
def test_cross_entropy_rejects_bad_targets(V, data):
    loss_fn = mt.CrossEntropyLoss(ignore_index=-100)
    logits = np.zeros((2, 3, V), dtype=np.float32)
    target = np.zeros((2, 3), dtype=np.int64)
    target[data.draw(st.integers(0, 1)), data.draw(st.integers(0, 2))] = data.draw(
        st.one_of(st.integers(V, V + 50), st.integers(-99, -1)))
    rejects(lambda: loss_fn(logits, target), "target", str(V))
    rejects(lambda: loss_fn(logits, np.zeros((2, 4), dtype=np.int64)), "target", "(2, 3)")
    rejects(lambda: loss_fn(logits, np.zeros((3, 2), dtype=np.int64)), "target")
    rejects(lambda: loss_fn(logits, np.zeros((2, 3))), "target", "dtype")
    rejects(lambda: loss_fn(logits.astype(np.int64), np.zeros((2, 3), dtype=np.int64)), "logits")
    rejects(lambda: loss_fn(logits.tolist(), np.zeros((2, 3), dtype=np.int64)), "logits")


@FAST
@given(bad=not_a_probability())
def test_cross_entropy_label_smoothing(bad):
    rejects(lambda: mt.CrossEntropyLoss(label_smoothing=bad), "label_smoothing")


@FAST
@given(bad=st.one_of(st.floats(), st.text(max_size=2), st.none(), st.booleans()))
def test_cross_entropy_ignore_index(bad):
    rejects(lambda: mt.CrossEntropyLoss(ignore_index=bad), "ignore_index")


# ========================================================================================== optimisers

def params(seed=0, n=2):
    rng = np.random.default_rng(seed)
    ps = [mt.Parameter(rng.standard_normal((3, 2))) for _ in range(n)]
    for p in ps:
        p.grad[...] = rng.standard_normal(p.grad.shape)
    return ps


OPTIMISER_ARGUMENTS = [
    ("SGD", "lr", not_a_positive_number),
    ("SGD", "momentum", not_a_probability),
    ("SGD", "weight_decay", not_a_non_negative_number),
    ("Adam", "lr", not_a_positive_number),
    ("Adam", "eps", not_a_non_negative_number),
    ("Adam", "weight_decay", not_a_non_negative_number),
]


@pytest.mark.parametrize("cls,arg,bad_values", OPTIMISER_ARGUMENTS, ids=[f"{c}.{a}" for c, a, _ in OPTIMISER_ARGUMENTS])
@FAST
@given(data=st.data())
def test_optimiser_hyperparameters(cls, arg, bad_values, data):
    bad = data.draw(bad_values())
    kwargs = {"lr": 0.1, arg: bad}
    rejects(lambda: getattr(optim, cls)(params(), **kwargs), arg)


@FAST
@given(betas=st.one_of(
    st.tuples(not_a_probability(), st.floats(0, 0.99)),
    st.tuples(st.floats(0, 0.99), not_a_probability()),
    st.lists(st.floats(0, 0.99), max_size=4).filter(lambda b: len(b) != 2),
    st.text(max_size=2), st.none()))
def test_adam_betas(betas):
    rejects(lambda: optim.Adam(params(), betas=betas), "betas")


@FAST
@given(which=st.sampled_from(["empty", "not params", "single", "twice", "None"]), cls=st.sampled_from(["SGD", "Adam"]))
def test_optimiser_params(which, cls):
    p = params()
    bad = {"empty": [], "not params": [np.zeros(3)], "single": p[0], "twice": [p[0], p[0]], "None": None}[which]
    rejects(lambda: getattr(optim, cls)(bad, lr=0.1), "params")


@FAST
@given(lr=st.floats(1e-6, 1.0), beta1=st.floats(0, 0.99), beta2=st.floats(0, 0.999), eps=st.floats(0, 1e-3),
       weight_decay=st.floats(0, 1.0), momentum=st.floats(0, 0.99), seed=seeds())
def test_optimisers_accept_valid_hyperparameters(lr, beta1, beta2, eps, weight_decay, momentum, seed):
    ps = params(seed)
    for opt in (optim.Adam(ps, lr=lr, betas=(beta1, beta2), eps=max(eps, 1e-12), weight_decay=weight_decay),
                optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=weight_decay)):
        for _ in range(2):
            opt.step()
        assert all(finite(p.data) for p in ps)


@FAST
@given(which=st.sampled_from(["d_model", "warmup", "factor"]), data=st.data())
def test_noam_schedule_rejects(which, data):
    bad = data.draw(not_a_positive_number() if which == "factor" else not_a_positive_int())
    kwargs = {"d_model": 8, "warmup": 4, "factor": 1.0, which: bad}
    rejects(lambda: optim.NoamSchedule(optim.SGD(params(), lr=1.0), **kwargs), which)


@FAST
@given(d_model=st.integers(1, 1024), warmup=st.integers(1, 20), factor=st.floats(1e-3, 10.0))
def test_noam_schedule_accepts(d_model, warmup, factor):
    opt = optim.SGD(params(), lr=1.0)
    sched = optim.NoamSchedule(opt, d_model=d_model, warmup=warmup, factor=factor)
    lrs = [sched.step() for _ in range(warmup + 3)]
    assert all(0 < lr < INF for lr in lrs) and opt.lr == lrs[-1]
    assert max(lrs) == pytest.approx(lrs[warmup - 1]) == pytest.approx(factor / math.sqrt(d_model * warmup))


def test_noam_schedule_needs_an_optimiser():
    rejects(lambda: optim.NoamSchedule(None, d_model=8), "optimizer")
    rejects(lambda: optim.NoamSchedule(optim.SGD(params(), lr=1.0), d_model=8).lr_at(0), "k")


@FAST
@given(max_norm=st.floats(1e-3, 10.0) | st.just(INF), seed=seeds())
def test_clip_grad_norm_accepts(max_norm, seed):
    ps = params(seed)
    before = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ps))
    total = optim.clip_grad_norm(ps, max_norm)
    after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ps))
    assert math.isclose(total, before, rel_tol=1e-6) and after <= min(max_norm, before) * (1 + 1e-6)


@FAST
@given(bad=st.one_of(st.floats(max_value=0.0), st.just(NAN), st.text(max_size=2), st.none(), st.booleans()))
def test_clip_grad_norm_rejects(bad):
    rejects(lambda: optim.clip_grad_norm(params(), bad), "max_norm")
    rejects(lambda: optim.clip_grad_norm([], 1.0), "parameters")


# ============================================================================================ decoding

@SLOW
@given(src=token_ids(11, B_max=2, T_max=4), beam_size=st.integers(1, 3), alpha=st.floats(0.0, 2.0),
       max_len=st.one_of(st.none(), st.integers(1, 3)))
def test_decoding_outputs(src, beam_size, alpha, max_len):
    model = tiny_model()
    B = np.shape(src)[0]
    greedy = decoding.greedy_decode(model, src, max_len=max_len)
    beam = decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len)
    limit = 7 if max_len is None else max_len
    for out in (greedy, beam):
        assert len(out) == B
        for ids in out:
            assert len(ids) <= limit and all(isinstance(i, int) and 3 <= i < 13 for i in ids)   # no pad/bos/eos


@FAST
@given(beam_size=not_a_positive_int())
def test_beam_size(beam_size):
    rejects(lambda: decoding.beam_search(tiny_model(), [[3, 4]], beam_size=beam_size), "beam_size")


@FAST
@given(alpha=st.one_of(st.floats(max_value=0.0, exclude_max=True), st.just(NAN), st.just(INF), st.text(max_size=2),
                       st.none()))
def test_beam_alpha(alpha):
    rejects(lambda: decoding.beam_search(tiny_model(), [[3, 4]], alpha=alpha), "alpha")


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search], ids=["greedy", "beam"])
@FAST
@given(max_len=not_a_positive_int().filter(lambda v: v is not None), case=bad_ids(13, 7))
def test_decoding_max_len_and_src(decode, max_len, case):
    model = tiny_model()
    rejects(lambda: decode(model, [[3, 4]], max_len=max_len), "max_len")
    _, bad, words = case
    rejects(lambda: decode(model, bad), "src", *words)
    rejects(lambda: decode(object(), [[3, 4]]), "model")


# ========================================================================================== tokenizers

TEXTS = ["the dog runs .", "a cat sleeps", "the cat runs fast !", "dogs and cats"]


@functools.cache
def tokenizer(kind):
    return (tokenizers.WordTokenizer.build(TEXTS) if kind == "word"
            else tokenizers.BPETokenizer.learn(TEXTS, num_merges=8, min_frequency=1))


@pytest.mark.parametrize("kind", ["word", "bpe"])
@FAST
@given(text=st.text(max_size=20), data=st.data())
def test_tokenizer_round_trip_shapes(kind, text, data):
    tok = tokenizer(kind)
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == mt.BOS and ids[-1] == mt.EOS and all(isinstance(i, int) and 0 <= i < len(tok) for i in ids)
    any_ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=8))
    assert isinstance(tok.decode(any_ids), str) and isinstance(tok.decode(np.array(any_ids, dtype=np.int64)), str)


@pytest.mark.parametrize("kind", ["word", "bpe"])
@FAST
@given(text=st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2), st.binary(max_size=3)))
def test_tokenizer_text_must_be_str(kind, text):
    tok = tokenizer(kind)
    rejects(lambda: tok.encode(text), "text")
    rejects(lambda: tok.tokenize(text), "text")


@pytest.mark.parametrize("kind", ["word", "bpe"])
@FAST
@given(data=st.data())
def test_tokenizer_decode_rejects_bad_ids(kind, data):
    tok = tokenizer(kind)
    V = len(tok)
    ids = data.draw(st.lists(st.integers(0, V - 1), max_size=4))
    pos = data.draw(st.integers(0, len(ids)))
    bad_id = data.draw(st.one_of(st.integers(min_value=V), st.integers(max_value=-1)))
    rejects(lambda: tok.decode(ids[:pos] + [bad_id] + ids[pos:]), f"ids[{pos}]", str(V))
    rejects(lambda: tok.decode(ids[:pos] + [float(bad_id)] + ids[pos:]), "ids")
    rejects(lambda: tok.decode(np.array([ids + [0]], dtype=np.int64)), "ids")       # 2-D
    rejects(lambda: tok.decode(np.array(ids + [0], dtype=np.float64)), "ids")
    rejects(lambda: tok.decode(data.draw(st.one_of(st.integers(), st.text(max_size=3), st.none()))), "ids")


SPECIALS = list(tokenizers.SPECIAL_TOKENS)


def bad_tokenizer_dicts():
    return st.one_of(
        st.fixed_dictionaries({"type": st.text(max_size=4).filter(lambda t: t not in ("word", "bpe")),
                               "tokens": st.just(SPECIALS)}),
        st.sampled_from([
            {"type": "word"},                                                    # no tokens
            {"type": "word", "tokens": 5},
            {"type": "word", "tokens": SPECIALS + [5]},
            {"type": "word", "tokens": ["a"] + SPECIALS},                         # specials not first
            {"type": "word", "tokens": SPECIALS + ["a", "b", "a"]},               # a repeated token shifts ids
            {"type": "bpe", "tokens": SPECIALS + ["a</w>"], "merges": [["a"]]},
            {"type": "bpe", "tokens": SPECIALS + ["a</w>"], "merges": "ab"},
            {"type": "word", "tokens": SPECIALS, "lowercase": "yes"},
        ]),
        st.lists(st.text(max_size=2), max_size=2), st.none(), st.text(max_size=4))


@FAST
@given(data=bad_tokenizer_dicts())
def test_tokenizer_from_dict_unknown_format(data):
    rejects(lambda: tokenizers.tokenizer_from_dict(data), "data")
    if isinstance(data, dict) and data.get("type") in ("word", "bpe"):
        cls = tokenizers.WordTokenizer if data["type"] == "word" else tokenizers.BPETokenizer
        rejects(lambda: cls.from_dict(data), "data")


@FAST
@given(text=st.text(max_size=10))
def test_tokenizer_from_json_bad_text(text):
    try:
        json.loads(text)
    except ValueError:
        pass
    else:
        assume(False)                                         # valid JSON: the dict test covers it
    rejects(lambda: tokenizers.tokenizer_from_json(text), "text")
    rejects(lambda: tokenizers.WordTokenizer.from_json(text), "text")
    rejects(lambda: tokenizers.tokenizer_from_json(None), "text")


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_tokenizer_round_trip_through_dict(kind):
    tok = tokenizer(kind)
    again = tokenizers.tokenizer_from_json(tok.to_json())
    assert again.to_dict() == tok.to_dict()


# ============================================================================================ batching

def pair_lists(max_pairs=8):
    ids = st.lists(st.integers(0, 30), min_size=1, max_size=6)
    return st.lists(st.tuples(ids, st.lists(st.integers(0, 30), max_size=6)), min_size=1, max_size=max_pairs)


@FAST
@given(pairs=pair_lists(), extra=st.integers(0, 20), seed=st.integers(0, 100))
def test_batcher_covers_every_pair_within_budget(pairs, extra, seed):
    longest = max(max(len(s), len(t) + 1) for s, t in pairs)
    max_tokens = longest + extra
    batcher = batching.BucketBatcher(pairs, max_tokens=max_tokens, seed=seed)
    seen = []
    for batch in batcher:
        B = len(batch)
        assert batch.src.shape[0] == batch.tgt_in.shape[0] == batch.tgt_out.shape[0] == B
        assert batch.tgt_in.shape == batch.tgt_out.shape and batch.src.dtype == np.int64
        assert batch.src.size <= max_tokens and batch.tgt_in.size <= max_tokens
        seen.extend(batch.indices.tolist())
    assert sorted(seen) == list(range(len(pairs)))


@FAST
@given(pairs=pair_lists(), bad=st.one_of(st.integers(max_value=0), st.floats(), st.text(max_size=2), st.none()))
def test_batcher_max_tokens(pairs, bad):
    rejects(lambda: batching.BucketBatcher(pairs, max_tokens=bad), "max_tokens")
    longest = max(max(len(s), len(t) + 1) for s, t in pairs)
    if longest > 1:
        rejects(lambda: batching.BucketBatcher(pairs, max_tokens=longest - 1), "max_tokens", str(longest))


@FAST
@given(pairs=pair_lists(4), row=st.integers(0, 3), side=st.integers(0, 1),
       bad=st.sampled_from(["float", "negative", "str", "nested", "int", "empty source", "not a pair"]))
def test_batching_rejects_bad_pairs(pairs, row, side, bad):
    row = row % len(pairs)
    pairs = [list(p) for p in pairs]
    if bad == "empty source":
        pairs[row][0] = []
    elif bad == "not a pair":
        pairs[row] = pairs[row][0]
    else:
        value = {"float": [1.5, 2.0], "negative": [3, -1], "str": ["a", "b"], "nested": [[1, 2], [3]], "int": 7}[bad]
        pairs[row][side] = value
    rejects(lambda: batching.collate(pairs), "pairs")
    if bad in ("int", "empty source", "not a pair"):                     # seen before any batch is made
        rejects(lambda: batching.BucketBatcher(pairs, max_tokens=100), "pairs")


def test_batching_empty():
    rejects(lambda: batching.collate([]), "pairs")
    rejects(lambda: batching.BucketBatcher([], max_tokens=10), "pairs")
    rejects(lambda: batching.BucketBatcher("ab", max_tokens=10), "pairs")


# ================================================================================================ bleu

WORDS = st.sampled_from(["the", "dog", "runs", "a", "cat", ".", "fast"])
SENTENCES = st.lists(WORDS, min_size=0, max_size=7).map(" ".join)


@FAST
@given(hyps=st.lists(SENTENCES, min_size=1, max_size=4), data=st.data())
def test_bleu_in_range(hyps, data):
    refs = data.draw(st.lists(SENTENCES, min_size=len(hyps), max_size=len(hyps)))
    score = bleu.corpus_bleu(hyps, refs)
    assert 0.0 <= score <= 100.0 + 1e-9 and math.isfinite(score)   # sacrebleu too gives 100.00000000000004
    assert bleu.corpus_bleu(hyps, [refs, hyps]) >= score - 1e-9         # adding a reference never hurts


@FAST
@given(n_hyp=st.integers(1, 4), n_ref=st.integers(0, 5))
def test_bleu_lengths_must_match(n_hyp, n_ref):
    assume(n_hyp != n_ref)
    hyps, refs = ["the dog"] * n_hyp, ["the dog"] * n_ref
    rejects(lambda: bleu.corpus_bleu(hyps, refs), "references")
    rejects(lambda: bleu.corpus_bleu(hyps, [["the dog"] * n_hyp, refs]), "references")


@FAST
@given(bad=st.one_of(st.integers(), st.none(), st.lists(st.integers(), max_size=2)), pos=st.integers(0, 2))
def test_bleu_non_str(bad, pos):
    hyps = ["a", "b", "c"]
    with_bad = hyps[:pos] + [bad] + hyps[pos + 1:]
    rejects(lambda: bleu.corpus_bleu(with_bad, hyps), "hypotheses")
    if bad is not None:                                        # None is an allowed gap in a reference stream
        rejects(lambda: bleu.corpus_bleu(hyps, with_bad), "references")
        rejects(lambda: bleu.corpus_bleu(hyps, [hyps, with_bad]), "references")
    rejects(lambda: bleu.corpus_bleu("a b", ["a b"]), "hypotheses")
    rejects(lambda: bleu.corpus_bleu([], []), "hypotheses")


# ============================================================================================ datasets

@FAST
@given(name=st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=10),
       split=st.sampled_from(["train", "valid", "test"]))
def test_multi30k_missing_directory_names_the_path(tmp_path_factory, name, split):
    missing = tmp_path_factory.getbasetemp() / "no_multi30k_here" / name
    err = rejects(lambda: datasets.load_multi30k(missing, split=split), str(missing), exc=(FileNotFoundError,))
    assert "download_multi30k" in str(err)


@FAST
@given(split=st.text(max_size=6))
def test_dataset_split_names(split):
    assume(split not in datasets.TOY_SPLITS)
    rejects(lambda: datasets.load_toy(split), "split")
    assume(split not in datasets.MULTI30K_SPLITS and split not in datasets.MULTI30K_ALIASES)
    rejects(lambda: datasets.load_multi30k("/nonexistent", split=split), "split")


@FAST
@given(src_lang=st.sampled_from(["en", "de", "fr", ""]), tgt_lang=st.sampled_from(["en", "de", "fr", ""]))
def test_dataset_languages(src_lang, tgt_lang):
    assume({src_lang, tgt_lang} != {"en", "de"})
    rejects(lambda: datasets.load_toy("test", src_lang=src_lang, tgt_lang=tgt_lang), "src_lang", "tgt_lang")


# =========================================================================================== gradcheck

@FAST
@given(module=st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just(np.zeros(3)), st.just(L.Linear)))
def test_gradcheck_needs_a_module(module):
    rejects(lambda: gradcheck.check(module, np.zeros((1, 3))), "module")


def test_gradcheck_refuses_float32_parameters():
    rejects(lambda: gradcheck.check(L.Linear(3, 2), np.zeros((1, 3))), "module", "float64")


@FAST
@given(arg=st.sampled_from(["eps", "tolerance", "max_entries"]), data=st.data())
def test_gradcheck_settings(arg, data):
    bad = data.draw(not_a_positive_int().filter(lambda v: v is not None) if arg == "max_entries"
                    else not_a_positive_number())
    mt.set_default_dtype("float64")
    rejects(lambda: gradcheck.check(L.Linear(3, 2), np.zeros((1, 3)), **{arg: bad}), arg)


@FAST
@given(d_in=st.integers(1, 3), d_out=st.integers(1, 3), B=st.integers(1, 2), seed=seeds())
def test_gradcheck_accepts_float64_modules(d_in, d_out, B, seed):
    mt.set_default_dtype("float64")
    report = gradcheck.check(L.Linear(d_in, d_out), floats_array(seed, (B, d_in), np.float32))  # input upcast
    assert report.ok and [r.name for r in report.rows] == ["input[0]", "W", "b"]


# ============================================================================================= backend

@FAST
@given(bad=st.one_of(st.text(max_size=5), st.none(), st.integers()))
def test_backend_settings(bad):
    assume(bad not in ("numpy", "cupy", "float32", "float64"))
    rejects(lambda: mt.set_backend(bad), "name")
    rejects(lambda: mt.set_default_dtype(bad), "dtype")
    if not (isinstance(bad, int) and bad >= 0):
        rejects(lambda: mt.manual_seed(bad), "seed")


# ====================================================================== the table for the closing note

def _model_call(src, tgt):
    return lambda: tiny_model()(src, tgt)


def _backward_of_wrong_shape():
    mt.manual_seed(0)
    model = mt.Transformer(mt.TransformerConfig(**CONFIG))
    model(_GOOD, _GOOD)
    model.backward(np.zeros((1, 4, 13)))


_GOOD = np.array([[3, 4, 5]])
_X = np.zeros((2, 3, 4), dtype=np.float32)

# (entry point, argument, bad value shown, call, exception type)
TABLE = [
    ("layers.Linear", "in_features", "0", lambda: L.Linear(0, 3), ValueError),
    ("layers.Linear.forward", "x", "shape (2, 3) for in_features=4", lambda: L.Linear(4, 2)(np.zeros((2, 3))), ValueError),
    ("layers.Linear.forward", "x", "a list", lambda: L.Linear(4, 2)([[0.0] * 4]), TypeError),
    ("layers.Linear.forward", "x", "int64 array", lambda: L.Linear(4, 2)(np.zeros((2, 4), dtype=int)), TypeError),
    ("layers.Embedding.forward", "ids", "[[0, 5]] with num_embeddings=5", lambda: L.Embedding(5, 4)(np.array([[0, 5]])),
     ValueError),
    ("layers.Embedding.forward", "ids", "[[-1, 2]]", lambda: L.Embedding(5, 4)(np.array([[-1, 2]])), ValueError),
    ("layers.Embedding.forward", "ids", "float ids [[1.0, 2.0]]", lambda: L.Embedding(5, 4)(np.array([[1.0, 2.0]])),
     TypeError),
    ("layers.PositionalEncoding", "d_model", "7 (odd)", lambda: L.PositionalEncoding(7), ValueError),
    ("layers.PositionalEncoding.forward", "x", "length 7 > max_len=6",
     lambda: L.PositionalEncoding(4, max_len=6)(np.zeros((1, 7, 4), dtype=np.float32)), ValueError),
    ("layers.PositionalEncoding.forward", "x", "1-D array (4,)",
     lambda: L.PositionalEncoding(4)(np.zeros(4, dtype=np.float32)), ValueError),
    ("layers.PositionalEncoding.forward", "offset", "-1", lambda: L.PositionalEncoding(4)(_X, offset=-1), ValueError),
    ("layers.PositionalEncoding.forward", "offset", "1.5", lambda: L.PositionalEncoding(4)(_X, offset=1.5), TypeError),
    ("layers.LearnedPositionalEmbedding.forward", "x", "1-D array (4,)",
     lambda: L.LearnedPositionalEmbedding(6, 4)(np.zeros(4, dtype=np.float32)), ValueError),
    ("layers.Dropout", "p", "1.0", lambda: L.Dropout(1.0), ValueError),
    ("layers.Dropout.forward", "x", "int64 array", lambda: L.Dropout(0.5)(np.zeros((2, 3), dtype=int)), TypeError),
    ("layers.LayerNorm", "eps", "inf", lambda: L.LayerNorm(4, eps=INF), ValueError),
    ("layers.LayerNorm", "eps", "'a'", lambda: L.LayerNorm(4, eps="a"), ValueError),
    ("layers.LayerNorm.forward", "x", "a list", lambda: L.LayerNorm(4)([[0.0] * 4]), TypeError),
    ("layers.PositionwiseFeedForward", "dropout", "1.0", lambda: L.PositionwiseFeedForward(4, 8, dropout=1.0),
     ValueError),
    ("layers.SublayerConnection", "dropout", "-0.1", lambda: L.SublayerConnection(4, dropout=-0.1), ValueError),
    ("layers.MultiHeadAttention", "num_heads", "3 with d_model=10", lambda: L.MultiHeadAttention(10, 3), ValueError),
    ("layers.MultiHeadAttention.forward", "query", "rank 2 (3, 4)", lambda: L.MultiHeadAttention(4, 2)(_X[0], _X, _X),
     ValueError),
    ("layers.MultiHeadAttention.forward", "key", "last dim 3 != d_model",
     lambda: L.MultiHeadAttention(4, 2)(_X, _X[..., :3], _X), ValueError),
    ("layers.MultiHeadAttention.forward", "mask", "a list",
     lambda: L.MultiHeadAttention(4, 2)(_X, _X, _X, [[True]]), TypeError),
    ("layers.MultiHeadAttention.forward", "mask", "int64 mask",
     lambda: L.MultiHeadAttention(4, 2)(_X, _X, _X, np.ones((2, 1, 1, 3), dtype=int)), TypeError),
    ("layers.MultiHeadAttention.forward", "mask", "shape (2, 1, 1, 5) for Tk=3",
     lambda: L.MultiHeadAttention(4, 2)(_X, _X, _X, np.ones((2, 1, 1, 5), dtype=bool)), ValueError),
    ("layers.ScaledDotProductAttention.forward", "k", "Dk 4 vs q's 3",
     lambda: L.ScaledDotProductAttention()(np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4))),
     ValueError),
    ("layers.Softmax.forward", "axis", "axis=3 on a 2-D x", lambda: L.Softmax(axis=3)(np.zeros((2, 2))), ValueError),
    ("masks.padding_mask", "ids", "float ids", lambda: masks.padding_mask(np.zeros((2, 3)), 0), TypeError),
    ("masks.padding_mask", "ids", "1-D ids", lambda: masks.padding_mask(np.array([1, 2, 0]), 0), ValueError),
    ("masks.padding_mask", "pad_id", "'0'", lambda: masks.padding_mask(np.zeros((2, 3), dtype=int), "0"), TypeError),
    ("masks.subsequent_mask", "T", "0", lambda: masks.subsequent_mask(0), ValueError),
    ("TransformerConfig", "num_heads", "3 with d_model=8",
     lambda: mt.TransformerConfig(**{**CONFIG, "num_heads": 3}), ValueError),
    ("TransformerConfig", "d_model", "5 (odd) with num_heads=5",
     lambda: mt.TransformerConfig(**{**CONFIG, "d_model": 5, "num_heads": 5}), ValueError),
    ("TransformerConfig", "dropout", "1.0", lambda: mt.TransformerConfig(**{**CONFIG, "dropout": 1.0}), ValueError),
    ("TransformerConfig", "max_len", "0", lambda: mt.TransformerConfig(**{**CONFIG, "max_len": 0}), ValueError),
    ("TransformerConfig", "eos_id", "11 with src_vocab_size=11", lambda: mt.TransformerConfig(**CONFIG, eos_id=11),
     ValueError),
    ("TransformerConfig", "bos_id", "0 = pad_id", lambda: mt.TransformerConfig(**CONFIG, bos_id=0), ValueError),
    ("TransformerConfig", "tie_output", "1 (not a bool)", lambda: mt.TransformerConfig(**CONFIG, tie_output=1), TypeError),
    ("TransformerConfig.preset", "name", "'huge'",
     lambda: mt.TransformerConfig.preset("huge", src_vocab_size=5, tgt_vocab_size=5), ValueError),
    ("TransformerConfig.preset", "name", "['tiny'] (unhashable)",
     lambda: mt.TransformerConfig.preset(["tiny"], src_vocab_size=5, tgt_vocab_size=5), ValueError),
    ("TransformerConfig.preset", "src_vocab_size", "missing", lambda: mt.TransformerConfig.preset("tiny"), TypeError),
    ("TransformerConfig.from_dict", "data", "a list", lambda: mt.TransformerConfig.from_dict(["d_model"]), TypeError),
    ("Transformer", "config", "a dict", lambda: mt.Transformer(CONFIG), TypeError),
    ("Transformer.forward", "tgt_in", "id 13 with tgt_vocab_size=13", _model_call(_GOOD, np.array([[1, 13]])), ValueError),
    ("Transformer.forward", "src", "id -1", _model_call(np.array([[-1, 3]]), _GOOD), ValueError),
    ("Transformer.forward", "src", "float ids", _model_call(_GOOD.astype(float), _GOOD), TypeError),
    ("Transformer.forward", "src", "1-D ids", _model_call(_GOOD[0], _GOOD), ValueError),
    ("Transformer.forward", "src", "batch 2 vs tgt_in batch 1", _model_call(np.ones((2, 3), dtype=int), _GOOD),
     ValueError),
    ("Transformer.forward", "src", "empty batch (0, 3)", _model_call(np.zeros((0, 3), dtype=int), _GOOD), ValueError),
    ("Transformer.forward", "tgt_in", "empty sentence (1, 0)", _model_call(_GOOD, np.zeros((1, 0), dtype=int)),
     ValueError),
    ("Transformer.forward", "src", "[] (empty list)", _model_call([], _GOOD), ValueError),
    ("Transformer.forward", "src", "length 8 > max_len=7", _model_call(np.ones((1, 8), dtype=int), _GOOD), ValueError),
    ("Transformer.forward", "src", "ragged [[3, 4], [5]]", _model_call([[3, 4], [5]], _GOOD), ValueError),
    ("Transformer.forward", "src", "'3 4 5' (a str)", _model_call("3 4 5", _GOOD), TypeError),
    ("Transformer.backward", "dlogits", "shape (1, 4, 13) vs logits (1, 3, 13)", _backward_of_wrong_shape, ValueError),
    ("Transformer.decode", "memory", "a list", lambda: tiny_model().decode(_GOOD, [[0.0] * 8]), TypeError),
    ("CrossEntropyLoss", "label_smoothing", "1.0", lambda: mt.CrossEntropyLoss(label_smoothing=1.0), ValueError),
    ("CrossEntropyLoss", "ignore_index", "0.0", lambda: mt.CrossEntropyLoss(ignore_index=0.0), TypeError),
    ("CrossEntropyLoss.forward", "target", "shape (2, 4) for logits (2, 3, 5)",
     lambda: mt.CrossEntropyLoss()(np.zeros((2, 3, 5)), np.zeros((2, 4), dtype=int)), ValueError),
    ("CrossEntropyLoss.forward", "target", "float targets",
     lambda: mt.CrossEntropyLoss()(np.zeros((2, 3, 5)), np.zeros((2, 3))), ValueError),
    ("CrossEntropyLoss.forward", "target", "id 5 with V=5",
     lambda: mt.CrossEntropyLoss()(np.zeros((2, 3, 5)), np.full((2, 3), 5)), ValueError),
    ("CrossEntropyLoss.forward", "logits", "int logits",
     lambda: mt.CrossEntropyLoss()(np.zeros((2, 5), dtype=int), np.zeros(2, dtype=int)), ValueError),
    ("optim.Adam", "lr", "0", lambda: optim.Adam(params(), lr=0), ValueError),
    ("optim.Adam", "lr", "inf", lambda: optim.Adam(params(), lr=INF), ValueError),
    ("optim.Adam", "betas", "(0.9,)", lambda: optim.Adam(params(), betas=(0.9,)), ValueError),
    ("optim.Adam", "betas", "(1.0, 0.98)", lambda: optim.Adam(params(), betas=(1.0, 0.98)), ValueError),
    ("optim.Adam", "eps", "-1e-9", lambda: optim.Adam(params(), eps=-1e-9), ValueError),
    ("optim.Adam", "weight_decay", "inf", lambda: optim.Adam(params(), weight_decay=INF), ValueError),
    ("optim.SGD", "momentum", "1.0", lambda: optim.SGD(params(), lr=0.1, momentum=1.0), ValueError),
    ("optim.SGD", "params", "[] (empty)", lambda: optim.SGD([], lr=0.1), ValueError),
    ("optim.SGD", "params", "[p, p] (twice)", lambda: optim.SGD([params()[0]] * 2, lr=0.1), ValueError),
    ("optim.NoamSchedule", "warmup", "0", lambda: optim.NoamSchedule(optim.SGD(params(), lr=1), 8, warmup=0),
     ValueError),
    ("optim.NoamSchedule", "factor", "inf", lambda: optim.NoamSchedule(optim.SGD(params(), lr=1), 8, factor=INF),
     ValueError),
    ("optim.NoamSchedule", "optimizer", "None", lambda: optim.NoamSchedule(None, 8), ValueError),
    ("optim.clip_grad_norm", "max_norm", "0", lambda: optim.clip_grad_norm(params(), 0), ValueError),
    ("optim.clip_grad_norm", "parameters", "[]", lambda: optim.clip_grad_norm([], 1.0), ValueError),
    ("decoding.beam_search", "beam_size", "0", lambda: decoding.beam_search(tiny_model(), _GOOD, beam_size=0),
     ValueError),
    ("decoding.beam_search", "alpha", "-0.5", lambda: decoding.beam_search(tiny_model(), _GOOD, alpha=-0.5), ValueError),
    ("decoding.beam_search", "alpha", "inf", lambda: decoding.beam_search(tiny_model(), _GOOD, alpha=INF), ValueError),
    ("decoding.greedy_decode", "max_len", "0", lambda: decoding.greedy_decode(tiny_model(), _GOOD, max_len=0),
     ValueError),
    ("decoding.greedy_decode", "src", "id 11 with src_vocab_size=11",
     lambda: decoding.greedy_decode(tiny_model(), np.array([[11]])), ValueError),
    ("decoding.greedy_decode", "model", "object()", lambda: decoding.greedy_decode(object(), _GOOD), TypeError),
    ("WordTokenizer.encode", "text", "5", lambda: tokenizer("word").encode(5), TypeError),
    ("BPETokenizer.decode", "ids", "[99]", lambda: tokenizer("bpe").decode([99]), ValueError),
    ("WordTokenizer.decode", "ids", "[1.0]", lambda: tokenizer("word").decode([1.0]), TypeError),
    ("WordTokenizer.decode", "ids", "2-D array", lambda: tokenizer("word").decode(np.zeros((2, 2), dtype=int)),
     ValueError),
    ("tokenizer_from_dict", "data", "{'type': 'xx'}", lambda: tokenizers.tokenizer_from_dict({"type": "xx"}), ValueError),
    ("WordTokenizer.from_dict", "data", "tokens=5",
     lambda: tokenizers.WordTokenizer.from_dict({"type": "word", "tokens": 5}), TypeError),
    ("WordTokenizer.from_dict", "data", "a repeated token",
     lambda: tokenizers.WordTokenizer.from_dict({"type": "word", "tokens": SPECIALS + ["a", "a"]}), ValueError),
    ("BPETokenizer.from_dict", "data", "merges [['a']]",
     lambda: tokenizers.BPETokenizer.from_dict({"type": "bpe", "tokens": SPECIALS, "merges": [["a"]]}), TypeError),
    ("tokenizer_from_json", "text", "'{not json'", lambda: tokenizers.tokenizer_from_json("{not json"), ValueError),
    ("batching.BucketBatcher", "max_tokens", "0", lambda: batching.BucketBatcher([([1], [2])], max_tokens=0),
     ValueError),
    ("batching.BucketBatcher", "pairs", "[]", lambda: batching.BucketBatcher([], max_tokens=10), ValueError),
    ("batching.collate", "pairs", "float ids [1.7, 2]", lambda: batching.collate([([1.7, 2], [3])]), TypeError),
    ("batching.collate", "pairs", "id -1", lambda: batching.collate([([-1], [3])]), ValueError),
    ("batching.collate", "pairs", "source 5 (an int)", lambda: batching.collate([(5, [3])]), TypeError),
    ("batching.collate", "pairs", "empty source", lambda: batching.collate([([], [3])]), ValueError),
    ("bleu.corpus_bleu", "references", "2 references for 1 hypothesis", lambda: bleu.corpus_bleu(["a"], ["a", "b"]),
     ValueError),
    ("bleu.corpus_bleu", "hypotheses", "[1]", lambda: bleu.corpus_bleu([1], ["a"]), TypeError),
    ("bleu.corpus_bleu", "references", "[['a'], [1]]", lambda: bleu.corpus_bleu(["a"], [["a"], [1]]), TypeError),
    ("datasets.load_multi30k", "directory", "/nonexistent/multi30k",
     lambda: datasets.load_multi30k("/nonexistent/multi30k"), FileNotFoundError),
    ("datasets.load_toy", "split", "'validation'", lambda: datasets.load_toy("validation"), ValueError),
    ("gradcheck.check", "module", "object()", lambda: gradcheck.check(object(), np.zeros(3)), TypeError),
    ("gradcheck.check", "module", "float32 parameters", lambda: gradcheck.check(L.Linear(3, 2), np.zeros((1, 3))),
     ValueError),
    ("gradcheck.check", "eps", "0", lambda: gradcheck.check(L.Linear(3, 2), np.zeros((1, 3)), eps=0), ValueError),
    ("gradcheck.check", "max_entries", "0",
     lambda: gradcheck.check(L.Linear(3, 2), np.zeros((1, 3)), max_entries=0), ValueError),
    ("set_backend", "name", "'torch'", lambda: mt.set_backend("torch"), ValueError),
    ("set_default_dtype", "dtype", "'int8'", lambda: mt.set_default_dtype("int8"), ValueError),
]

# what each message must name when it is not the argument itself
_NAMED = {"directory": "/nonexistent/multi30k", "T": "T must"}


@pytest.mark.parametrize("entry,arg,shown,call,exc", TABLE, ids=[f"{e}-{a}-{s}" for e, a, s, _, _ in TABLE])
def test_table(entry, arg, shown, call, exc):
    rejects(call, _NAMED.get(arg, arg), exc=(exc,))


def validation_table() -> str:
    """TABLE as Markdown: entry point, argument, bad value, exception, message (for the closing note)."""
    lines = ["| entry point | argument | bad value | exception | message |", "|---|---|---|---|---|"]
    for entry, arg, shown, call, _ in TABLE:
        try:
            call()
            got, message = "(accepted)", ""
        except Exception as err:  # noqa: BLE001 - the table shows whatever came
            got, message = type(err).__name__, str(err).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{entry}` | `{arg}` | {shown} | {got} | {message} |")
    return "\n".join(lines)
