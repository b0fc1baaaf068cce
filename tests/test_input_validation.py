"""Every refusal of the public entry points, each tested once: a ValueError or TypeError (never a bare
IndexError or a NumPy broadcasting error from deep inside) whose message names the owner and the argument.

- constructors: the layers' sizes, rates and switches, TransformerConfig's fields, the optimisers, the
  schedule and the loss;
- Transformer.forward (its token ids), backward and decode;
- the decoding functions' arguments;
- gradcheck.check's arguments.
The checks behind them live in minitransformer/checks.py, one helper per kind of argument; a helper that
many constructors share is tested through one of them here. A layer called directly, ``layer(x)``, is in
test_layers_errors.py; the loss's logits and targets in test_loss.py; the backend switches in
test_module.py; the command line in test_cli.py.
"""

import functools

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import decoding, gradcheck, masks, optim
from minitransformer import layers as L

NAN, INF = float("nan"), float("inf")


def case(id, call, exc, match):
    return pytest.param(call, exc, match, id=id)


def check_table(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    assert type(info.value) is exc                             # exactly that type, not a subclass from deep inside


# ============================================================================== layer constructors

POSITIVE_INT = "must be a positive int, got "
FRACTION = r"must be a number in \[0, 1\), got "

LAYERS = [
    case("Linear.in_features=0", lambda: L.Linear(0, 3), ValueError, r"Linear: in_features " + POSITIVE_INT + "0"),
    case("Linear.out_features=2.5", lambda: L.Linear(3, 2.5), ValueError, r"Linear: out_features " + POSITIVE_INT),
    case("Embedding.num_embeddings=True", lambda: L.Embedding(True, 4), ValueError,
         r"Embedding: num_embeddings " + POSITIVE_INT + "True"),
    case("Embedding.d_model=-1", lambda: L.Embedding(5, -1), ValueError, r"Embedding: d_model " + POSITIVE_INT),
    case("Embedding.scale='yes'", lambda: L.Embedding(5, 4, scale="yes"), TypeError,
         r"Embedding: scale must be a bool, got 'yes'"),
    case("PositionalEncoding.d_model=7", lambda: L.PositionalEncoding(7), ValueError,
         r"PositionalEncoding: d_model must be even \(sin/cos pairs\), got 7"),
    case("PositionalEncoding.max_len=0", lambda: L.PositionalEncoding(4, max_len=0), ValueError,
         r"PositionalEncoding: max_len " + POSITIVE_INT + "0"),
    case("LearnedPositionalEmbedding.max_len=None", lambda: L.LearnedPositionalEmbedding(None, 4), ValueError,
         r"LearnedPositionalEmbedding: max_len " + POSITIVE_INT + "None"),
    case("LayerNorm.d_model='4'", lambda: L.LayerNorm("4"), ValueError, r"LayerNorm: d_model " + POSITIVE_INT),
    case("LayerNorm.eps=0", lambda: L.LayerNorm(4, eps=0), ValueError,
         r"LayerNorm: eps must be a finite number > 0, got 0"),
    case("LayerNorm.eps=inf", lambda: L.LayerNorm(4, eps=INF), ValueError, r"LayerNorm: eps must be a finite number"),
    case("LayerNorm.eps=nan", lambda: L.LayerNorm(4, eps=NAN), ValueError, r"LayerNorm: eps must be a finite number"),
    case("Dropout.p=1.0", lambda: L.Dropout(1.0), ValueError, r"Dropout: p " + FRACTION + r"1\.0"),
    case("Dropout.p=-0.1", lambda: L.Dropout(-0.1), ValueError, r"Dropout: p " + FRACTION),
    case("Dropout.p=nan", lambda: L.Dropout(NAN), ValueError, r"Dropout: p " + FRACTION + "nan"),
    case("Dropout.p='0.1'", lambda: L.Dropout("0.1"), ValueError, r"Dropout: p " + FRACTION + "'0.1'"),
    case("Softmax.axis=1.0", lambda: L.Softmax(axis=1.0), TypeError, r"Softmax: axis must be an int, got 1\.0"),
    case("PositionwiseFeedForward.d_model=0", lambda: L.PositionwiseFeedForward(0, 6), ValueError,
         r"PositionwiseFeedForward: d_model " + POSITIVE_INT),
    # A composite's error may name the child that refuses: d_ff is the first Linear's out_features.
    case("PositionwiseFeedForward.d_ff=0", lambda: L.PositionwiseFeedForward(4, 0), ValueError,
         r"Linear: out_features " + POSITIVE_INT + "0"),
    case("PositionwiseFeedForward.dropout=1.0", lambda: L.PositionwiseFeedForward(4, 6, dropout=1.0), ValueError,
         r"Dropout: p " + FRACTION),
    case("MultiHeadAttention.num_heads=0", lambda: L.MultiHeadAttention(4, 0), ValueError,
         r"MultiHeadAttention: num_heads " + POSITIVE_INT + "0"),
    case("MultiHeadAttention.d_model%num_heads", lambda: L.MultiHeadAttention(10, 3), ValueError,
         r"MultiHeadAttention: d_model must be divisible by num_heads \(or give d_k\), got d_model=10, num_heads=3"),
    case("MultiHeadAttention.d_k=0", lambda: L.MultiHeadAttention(10, 3, d_k=0), ValueError,
         r"MultiHeadAttention: d_k " + POSITIVE_INT + "0"),
    case("MultiHeadAttention.d_v=-1", lambda: L.MultiHeadAttention(9, 3, d_v=-1), ValueError,
         r"MultiHeadAttention: d_v " + POSITIVE_INT + "-1"),
    case("MultiHeadAttention.d_v=2.0", lambda: L.MultiHeadAttention(9, 3, d_v=2.0), ValueError,
         r"MultiHeadAttention: d_v " + POSITIVE_INT + "2.0"),
    case("ScaledDotProductAttention.scale=1", lambda: L.ScaledDotProductAttention(scale=1), TypeError,
         r"ScaledDotProductAttention: scale must be a bool, got 1"),
    case("SublayerConnection.norm_first=None", lambda: L.SublayerConnection(4, norm_first=None), TypeError,
         r"SublayerConnection: norm_first must be a bool, got None"),
    case("subsequent_mask.T=0", lambda: masks.subsequent_mask(0), ValueError, r"subsequent_mask: T " + POSITIVE_INT),
    case("local_mask.r=-1", lambda: masks.local_mask(4, -1), ValueError,
         r"local_mask: r must be an int >= 0 \(the window's radius\), got -1"),
    case("padding_mask.ids float", lambda: masks.padding_mask(np.zeros((2, 3)), 0), TypeError,
         r"padding_mask: ids must be an integer array"),
    case("padding_mask.ids 1-D", lambda: masks.padding_mask(np.array([1, 2, 0]), 0), ValueError,
         r"padding_mask: ids must be a 2-D array"),
    case("padding_mask.pad_id='0'", lambda: masks.padding_mask(np.zeros((2, 3), dtype=int), "0"), TypeError,
         r"padding_mask: pad_id must be an int"),
]


@pytest.mark.parametrize("call,exc,match", LAYERS)
def test_layer_constructors(call, exc, match):
    check_table(call, exc, match)


# ================================================================================= configuration

CONFIG = {"src_vocab_size": 11, "tgt_vocab_size": 13, "d_model": 8, "num_heads": 2, "num_encoder_layers": 1,
          "num_decoder_layers": 1, "d_ff": 16, "dropout": 0.1, "max_len": 7}


def config(**overrides):
    return lambda: mt.TransformerConfig(**{**CONFIG, **overrides})


def config_case(field, value, exc=ValueError, match=None):
    return case(f"{field}={value!r}", config(**{field: value}), exc,
                rf"TransformerConfig: {field} " + (match or POSITIVE_INT))


CONFIGS = [
    config_case("src_vocab_size", 0),
    config_case("tgt_vocab_size", 2.5),
    config_case("d_model", -2),
    config_case("num_heads", None),
    config_case("num_encoder_layers", 0),
    config_case("num_decoder_layers", True),
    config_case("d_ff", "16"),
    config_case("max_len", 0),
    config_case("d_k", 0),
    config_case("d_v", 0),
    config_case("d_v", "8"),
    config_case("dropout", 1.0, match=FRACTION),
    config_case("pad_id", 11, match=r"must be an int in \[0, 11\) \(inside both vocabularies\), got 11"),
    config_case("bos_id", -1, match=r"must be an int in \[0, 11\)"),
    config_case("eos_id", 2.0, TypeError, r"must be an int, got 2\.0"),
    config_case("share_embeddings", "no", TypeError, "must be a bool"),
    config_case("tie_output", 1, TypeError, "must be a bool, got 1"),
    config_case("norm_first", None, TypeError, "must be a bool"),
    config_case("positional", "relative", match=r"must be one of \['learned', 'sinusoidal'\], got 'relative'"),
    case("d_model%num_heads", config(num_heads=3), ValueError,
         r"TransformerConfig: d_model must be divisible by num_heads \(or give d_k\), got d_model=8, num_heads=3"),
    case("d_model odd", config(d_model=5, num_heads=5), ValueError, r"TransformerConfig: d_model must be even"),
    case("special ids not distinct", config(bos_id=0), ValueError,
         r"TransformerConfig: pad_id, bos_id and eos_id must be distinct, got 0, 0, 2"),
    case("share_embeddings with two vocabularies", config(share_embeddings=True), ValueError,
         r"TransformerConfig: share_embeddings needs src_vocab_size == tgt_vocab_size, got 11 and 13"),
    case("preset name", lambda: mt.TransformerConfig.preset("huge", src_vocab_size=5, tgt_vocab_size=5), ValueError,
         r"TransformerConfig.preset: name must be one of \['base', 'small', 'tiny'\], got 'huge'"),
    case("preset without vocabularies", lambda: mt.TransformerConfig.preset("tiny", tgt_vocab_size=5), TypeError,
         r"TransformerConfig.preset\('tiny'\): pass src_vocab_size as keyword"),
    case("from_dict not a dict", lambda: mt.TransformerConfig.from_dict(["d_model"]), TypeError,
         r"TransformerConfig.from_dict: data must be a dict"),
    case("from_dict unknown key", lambda: mt.TransformerConfig.from_dict({**CONFIG, "colour": 1}), ValueError,
         r"TransformerConfig.from_dict: unknown keys \['colour'\]"),
    case("Transformer(config=dict)", lambda: mt.Transformer(CONFIG), TypeError,
         r"Transformer: config must be a TransformerConfig, got dict"),
]


@pytest.mark.parametrize("call,exc,match", CONFIGS)
def test_configuration(call, exc, match):
    check_table(call, exc, match)


# ============================================================================ optimisers and loss

def params():
    ps = [mt.Parameter(np.ones((3, 2))), mt.Parameter(np.ones(4))]
    for p in ps:
        p.grad[...] = 1.0
    return ps


def sgd():
    return optim.SGD(params(), lr=1.0)


OPTIMISERS = [
    case("params empty", lambda: optim.SGD([], lr=0.1), ValueError, r"SGD: params must be a non-empty list"),
    case("params a single Parameter", lambda: optim.Adam(params()[0]), ValueError,
         r"Adam: params must be an iterable of Parameters .*got a single Parameter"),
    case("params not iterable", lambda: optim.Adam(None), ValueError,
         r"Adam: params must be an iterable of Parameters .*got NoneType"),
    case("params twice", lambda: optim.Adam(params()[:1] * 2), ValueError, r"Adam: params lists a Parameter more"),
    case("params[1] an array", lambda: optim.SGD([params()[0], np.zeros(3)], lr=0.1), TypeError,
         r"SGD: params\[1\] must be a Parameter"),
    case("lr=0", lambda: optim.Adam(params(), lr=0), ValueError, r"Adam: lr must be a finite number > 0, got 0"),
    case("lr=nan", lambda: optim.SGD(params(), lr=NAN), ValueError, r"SGD: lr must be a finite number > 0, got nan"),
    case("lr=inf", lambda: optim.Adam(params(), lr=INF), ValueError, r"Adam: lr must be a finite number > 0"),
    case("betas=(0.9,)", lambda: optim.Adam(params(), betas=(0.9,)), ValueError,
         r"Adam: betas must be a pair \(beta1, beta2\)"),
    case("betas[0]=1.0", lambda: optim.Adam(params(), betas=(1.0, 0.98)), ValueError, r"Adam: betas\[0\] " + FRACTION),
    case("betas[1]=-0.1", lambda: optim.Adam(params(), betas=(0.9, -0.1)), ValueError, r"Adam: betas\[1\] " + FRACTION),
    case("eps=-1e-9", lambda: optim.Adam(params(), eps=-1e-9), ValueError, r"Adam: eps must be a finite number >= 0"),
    case("weight_decay=inf", lambda: optim.Adam(params(), weight_decay=INF), ValueError,
         r"Adam: weight_decay must be a finite number >= 0, got inf"),
    case("momentum=1.0", lambda: optim.SGD(params(), lr=0.1, momentum=1.0), ValueError, r"SGD: momentum " + FRACTION),
    case("SGD weight_decay=-1", lambda: optim.SGD(params(), lr=0.1, weight_decay=-1), ValueError,
         r"SGD: weight_decay must be a finite number >= 0, got -1"),
    case("schedule optimizer=None", lambda: optim.NoamSchedule(None, 8), ValueError,
         r"NoamSchedule: optimizer must be an optimiser with an lr attribute, got NoneType"),
    case("schedule d_model=0", lambda: optim.NoamSchedule(sgd(), 0), ValueError,
         r"NoamSchedule: d_model " + POSITIVE_INT),
    case("schedule warmup=0", lambda: optim.NoamSchedule(sgd(), 8, warmup=0), ValueError,
         r"NoamSchedule: warmup " + POSITIVE_INT + "0"),
    case("schedule factor=inf", lambda: optim.NoamSchedule(sgd(), 8, factor=INF), ValueError,
         r"NoamSchedule: factor must be a finite number > 0, got inf"),
    case("schedule lr_at(0)", lambda: optim.NoamSchedule(sgd(), 8).lr_at(0), ValueError,
         r"NoamSchedule.lr_at: k " + POSITIVE_INT + "0"),
    case("clip max_norm=0", lambda: optim.clip_grad_norm(params(), 0), ValueError,
         r"clip_grad_norm: max_norm must be a number > 0, got 0"),
    case("clip max_norm=nan", lambda: optim.clip_grad_norm(params(), NAN), ValueError, r"clip_grad_norm: max_norm"),
    case("clip parameters=[]", lambda: optim.clip_grad_norm([], 1.0), ValueError,
         r"clip_grad_norm: parameters must be a non-empty list"),
    case("loss label_smoothing=1.0", lambda: mt.CrossEntropyLoss(label_smoothing=1.0), ValueError,
         r"CrossEntropyLoss: label_smoothing " + FRACTION + r"1\.0"),
    case("loss ignore_index=0.5", lambda: mt.CrossEntropyLoss(ignore_index=0.5), TypeError,
         r"CrossEntropyLoss: ignore_index must be an int, got 0\.5"),
]


@pytest.mark.parametrize("call,exc,match", OPTIMISERS)
def test_optimisers_schedule_and_loss(call, exc, match):
    check_table(call, exc, match)


# ========================================================================================= model

@functools.cache
def tiny_model():
    """One small model for every inference refusal (eval mode: forwards need no backward)."""
    mt.manual_seed(0)
    return mt.Transformer(mt.TransformerConfig(**CONFIG)).eval()


GOOD = np.array([[3, 4, 5]])


def forward(src, tgt_in=GOOD):
    return lambda: tiny_model()(src, tgt_in)


MODEL = [
    case("src a str", forward("3 4 5"), TypeError, r"Transformer: src must be an integer array of token ids, got str"),
    case("tgt_in None", forward(GOOD, None), TypeError, r"Transformer: tgt_in must be an integer array"),
    case("src float", forward(GOOD.astype(float)), TypeError,
         r"Transformer: src must hold integer token ids, got dtype float64"),
    case("tgt_in bool", forward(GOOD, GOOD > 3), TypeError, r"Transformer: tgt_in must hold integer token ids"),
    case("src 1-D", forward(GOOD[0]), ValueError, r"Transformer: src must be a 2-D array \(B, T\) of token ids, got "
                                                   r"shape \(3,\)"),
    case("tgt_in 3-D", forward(GOOD, GOOD[None]), ValueError, r"Transformer: tgt_in must be a 2-D array"),
    case("src empty", forward(np.zeros((1, 0), dtype=int)), ValueError,
         r"Transformer: src must be non-empty, got shape \(1, 0\)"),
    case("src ragged", forward([[3, 4], [5]]), ValueError, r"Transformer: src must be a rectangular table"),
    case("tgt_in id = V", forward(GOOD, np.array([[1, 13]])), ValueError,
         r"Transformer: tgt_in must hold token ids in \[0, 13\), got values in \[1, 13\]"),
    case("src id -1", forward(np.array([[-1, 3]])), ValueError, r"Transformer: src must hold token ids in \[0, 11\)"),
    case("src longer than max_len", forward(np.ones((1, 8), dtype=int)), ValueError,
         r"Transformer: src has length 8, longer than the config's max_len=7"),
    case("batch sizes differ", forward(np.ones((2, 3), dtype=int)), ValueError,
         r"Transformer: src and tgt_in must have the same batch size, got src \(2, 3\) and tgt_in \(1, 3\)"),
    case("decode memory a list", lambda: tiny_model().decode(GOOD, [[0.0] * 8]), TypeError,
         r"Transformer.decode: memory must be a float array, got list"),
    case("decode memory d_model", lambda: tiny_model().decode(GOOD, np.zeros((1, 2, 6))), ValueError,
         r"Transformer.decode: memory must have last dimension 8"),
    case("decode memory batch", lambda: tiny_model().decode(GOOD, np.zeros((2, 2, 8))), ValueError,
         r"Transformer.decode: memory must have the batch size of tgt_in \(1\)"),
    case("decode tgt_in id", lambda: tiny_model().decode(np.array([[13]]), np.zeros((1, 2, 8))), ValueError,
         r"Transformer.decode: tgt_in must hold token ids in \[0, 13\)"),
]


@pytest.mark.parametrize("call,exc,match", MODEL)
def test_transformer_inputs(call, exc, match):
    check_table(call, exc, match)


def test_a_refused_call_leaves_the_model_usable():
    """The ids are checked before any layer runs: a refused call in training mode caches nothing, and the next
    forward and backward run. backward refuses a dlogits that is not a float array."""
    mt.manual_seed(0)
    model = mt.Transformer(mt.TransformerConfig(**CONFIG))
    with pytest.raises(ValueError, match="tgt_in must hold token ids"):
        model(GOOD, np.array([[1, 13]]))
    logits = model(GOOD, GOOD)
    with pytest.raises(TypeError, match=r"Transformer.backward: dlogits must be a float array, got dtype int64"):
        model.backward(np.zeros(logits.shape, dtype=np.int64))
    model.backward(np.zeros_like(logits))


# ====================================================================================== decoding

DECODING = [
    case("model not a Transformer", lambda: decoding.greedy_decode(object(), GOOD), TypeError,
         r"greedy_decode: model must be a minitransformer Transformer, got object"),
    case("src id = V", lambda: decoding.beam_search(tiny_model(), np.array([[11]])), ValueError,
         r"beam_search: src must hold token ids in \[0, 11\)"),
    case("src longer than max_len", lambda: decoding.greedy_decode(tiny_model(), np.ones((1, 8), dtype=int)),
         ValueError, r"greedy_decode: src has length 8, longer than the config's max_len=7"),
    case("max_len=0", lambda: decoding.greedy_decode(tiny_model(), GOOD, max_len=0), ValueError,
         r"greedy_decode: max_len " + POSITIVE_INT + "0"),
    case("beam_size=0", lambda: decoding.beam_search(tiny_model(), GOOD, beam_size=0), ValueError,
         r"beam_search: beam_size " + POSITIVE_INT + "0"),
    case("beam_size=2.0", lambda: decoding.beam_search(tiny_model(), GOOD, beam_size=2.0), ValueError,
         r"beam_search: beam_size " + POSITIVE_INT),
    case("alpha=-0.1", lambda: decoding.beam_search(tiny_model(), GOOD, alpha=-0.1), ValueError,
         r"beam_search: alpha must be a finite number >= 0, got -0.1"),
    case("alpha=inf", lambda: decoding.beam_search(tiny_model(), GOOD, alpha=INF), ValueError,
         r"beam_search: alpha must be a finite number >= 0, got inf"),
]


@pytest.mark.parametrize("call,exc,match", DECODING)
def test_decoding_arguments(call, exc, match):
    check_table(call, exc, match)


# ===================================================================================== gradcheck

def linear64():
    mt.set_default_dtype("float64")                           # conftest restores float32
    return L.Linear(3, 2)


X = np.zeros((1, 3))

GRADCHECK = [
    case("module not a Module", lambda: gradcheck.check(L.Linear, X), TypeError,
         r"gradcheck.check: module must be a minitransformer Module, got type"),
    case("float32 parameters", lambda: gradcheck.check(L.Linear(3, 2), X), ValueError,
         r"gradcheck.check: module's parameter 'W' is float32; finite differences need float64"),
    case("eps=0", lambda: gradcheck.check(linear64(), X, eps=0), ValueError,
         r"gradcheck.check: eps must be a finite number > 0, got 0"),
    case("tolerance=nan", lambda: gradcheck.check(linear64(), X, tolerance=NAN), ValueError,
         r"gradcheck.check: tolerance must be a finite number > 0"),
    case("max_entries=0", lambda: gradcheck.check(linear64(), X, max_entries=0), ValueError,
         r"gradcheck.check: max_entries " + POSITIVE_INT + "0"),
]


@pytest.mark.parametrize("call,exc,match", GRADCHECK)
def test_gradcheck_arguments(call, exc, match):
    check_table(call, exc, match)
