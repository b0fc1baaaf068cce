"""The fast tier equals the core: the 'fast equals core' half of the suite.

The core (mt.Transformer, mt.layers, mt.CrossEntropyLoss, mt.optim.Adam) is the reference, proven by the
gradient checks and the PyTorch parity tests. Everything in mt.fast exists for speed only, so each piece is
held here against its core twin, in float64 where arithmetic is compared (only rounding may differ):

- the whole model: mt.fast.Transformer against mt.Transformer with the same weights, on batches padded in
  source and target, for every weight-tying setting, post-LN and pre-LN, sinusoidal and learned positions:
  logits at the real target positions, the loss, every parameter's gradient; encode, greedy and beam
  decoding; the state_dict and checkpoints moving between the two;
- each fast layer (mt.fast.FAST_TWINS) against its core class, forward and backward, packed and not;
- the fast dropout's own rule (16-bit draws), the fused loss, the chunked/threaded/flat Adam;
- the machinery with no core twin: Packing, stacked_linear, random_uint16, the thread pool;
- the fast step on a device backend (tests/fakecupy.py, and CuPy where there is a GPU).

The comparisons run on the session's backend (conftest.py): inputs go there with ``dev``, results come back
with ``host``, so the whole file also runs with MINITRANSFORMER_BACKEND=cupy (benchmarks/gpu.sh) or
MINITRANSFORMER_TEST_BACKEND=fakecupy. Tests of the NumPy backend's own machinery (threads, CPU slices,
64-bit words cut into 16-bit draws) are skipped there.
"""

import copy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fakecupy
import numpy as np
import pytest
import threadpoolctl
from devices import TOLERANCE, use

import minitransformer as mt
from minitransformer import layers as L
from minitransformer import model as M
from minitransformer.fast import FAST_TWINS, Packing
from minitransformer.fast import threads as fast_threads
from minitransformer.fast.optim import CPU_CHUNK
from minitransformer.kit.running import checkpoint as ck
from minitransformer.masks import padding_mask, subsequent_mask

PAD = 0
REL_TOL = 1e-10         # float64, the same formulas in another order: only rounding differs (seen: ~1e-15)
# A gradient that is zero by the mathematics (the key projection's bias shifts every score of a row alike,
# which softmax ignores) is float64 rounding noise, ~1e-16 of the other gradients, on both sides.
ZERO_GRAD_ATOL = 1e-12
ZERO_BY_MATH = ("W_k.b",)

ON_DEVICE = mt.get_backend() != "numpy"                     # the session's backend (conftest.py)
cpu_only = pytest.mark.skipif(ON_DEVICE, reason="the NumPy backend's own machinery")


def dev(x):
    """A host array on the session's backend (a no-op on NumPy)."""
    return mt.backend.asarray(x)


def host(x):
    return mt.to_numpy(x)


# ============================================================================================ helpers

def padded_ids(rng, lengths, T, vocab=11, low=3):
    """(B,T) ids, sentence b real for its first lengths[b] positions, padding after."""
    ids = np.full((len(lengths), T), PAD)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(low, vocab, size=n)
    return ids


def perturb(module, seed=7):
    """Move every weight off its initial value (biases off 0, gamma off 1), so none hides a bug."""
    rng = np.random.default_rng(seed)
    for p in module.parameters():
        p.data += dev(0.3 * rng.standard_normal(p.data.shape))
    return module


def fast_twin(module):
    """A copy of a core module made fast, as mt.fast.Transformer builds itself."""
    return mt.fast.make_fast(copy.deepcopy(module))


def as_list(grads):
    if grads is None:
        return []
    return list(grads) if isinstance(grads, tuple) else [grads]


def assert_rel(actual, expected, what, tol=REL_TOL):
    """max |actual - expected| / max |expected| < tol, and expected not all zero (then nothing is compared)."""
    actual, expected = host(actual), host(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    scale = np.abs(expected).max(initial=0.0)
    assert scale > 0, f"{what}: the reference is all zero, so the comparison proves nothing"
    err = np.abs(actual - expected).max() / scale
    assert err < tol, f"{what}: max |fast - core| / max |core| = {err:.2e} (bound {tol:.0e})"


def assert_same_grads(core, fast, tol=REL_TOL):
    """Every parameter's gradient, by name; the ones zero by the mathematics with an absolute bound."""
    core_params, fast_params = core.named_parameters(), fast.named_parameters()
    assert [n for n, _ in fast_params] == [n for n, _ in core_params]
    for (name, p), (_, q) in zip(core_params, fast_params):
        if name.endswith(ZERO_BY_MATH):
            worst = max(np.abs(host(p.grad)).max(), np.abs(host(q.grad)).max())
            assert worst < ZERO_GRAD_ATOL, f"gradient of {name} should be zero, got {worst:.2e}"
        else:
            assert_rel(q.grad, p.grad, f"gradient of {name}", tol)


# ===================================================================== the model: fast.Transformer vs core

def model_config(tie_output=True, share_embeddings=False, norm_first=False, positional="sinusoidal", d_k=None,
                 d_v=None):
    return mt.TransformerConfig(13, 13 if share_embeddings else 11, d_model=10, num_heads=2, num_encoder_layers=2,
                                num_decoder_layers=2, d_ff=7, dropout=0.0, max_len=12, tie_output=tie_output,
                                share_embeddings=share_embeddings, norm_first=norm_first, positional=positional,
                                d_k=d_k, d_v=d_v)


def model_pair(cfg):
    mt.manual_seed(3)
    core = perturb(mt.Transformer(cfg))
    fast = mt.fast.Transformer(cfg)
    fast.load_state_dict(core.state_dict())
    return core, fast


def model_batch(rng, vocab=11):
    """Right-padded src (3,7), tgt_in and tgt_out (3,5): padding in both, one sentence with none."""
    src = padded_ids(rng, [7, 3, 5], T=7, vocab=vocab)
    tgt = padded_ids(rng, [6, 2, 4], T=6, vocab=vocab)
    tgt[:, 0] = 1                                              # BOS
    return src, tgt[:, :-1], tgt[:, 1:]


TYING = [(True, False), (False, False), (True, True), (False, True)]   # (tie_output, share_embeddings)


@pytest.mark.parametrize("tie_output, share_embeddings", TYING)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional, d_k, d_v", [("sinusoidal", None, None), ("learned", 3, None),
                                                  ("sinusoidal", 3, 7)])
def test_fast_transformer_equals_the_core(float64, rng, tie_output, share_embeddings, norm_first, positional, d_k,
                                          d_v):
    """Same weights, a batch padded in source and target: the logits at every real target position, the
    label-smoothed loss, and the gradient of every parameter (each through its own tier's loss)."""
    cfg = model_config(tie_output, share_embeddings, norm_first, positional, d_k, d_v)
    core, fast = model_pair(cfg)
    assert list(fast.state_dict()) == list(core.state_dict())
    src, tgt_in, tgt_out = model_batch(rng, vocab=11)
    real = tgt_in != PAD

    core_logits = core(src, tgt_in)
    fast_logits = fast(src, tgt_in)
    assert_rel(host(fast_logits)[real], host(core_logits)[real], "logits at the real target positions")
    # The padded target positions' logits are those of a zero vector: 0 tied, the bias untied.
    padded = host(fast_logits)[~real]
    expected = 0.0 if tie_output else np.broadcast_to(host(fast.projection.b.data), padded.shape)
    np.testing.assert_array_equal(padded, expected)

    core_loss_fn = mt.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    fast_loss_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    core_loss, fast_loss = core_loss_fn(core_logits, tgt_out), fast_loss_fn(fast_logits, tgt_out)
    assert abs(fast_loss - core_loss) <= REL_TOL * core_loss
    core.backward(core_loss_fn.backward())
    fast.backward(fast_loss_fn.backward())
    assert_same_grads(core, fast)


def test_every_submodule_of_the_fast_transformer_is_a_fast_twin():
    """mt.fast.Transformer swaps every class that has a twin, keeps the others, and adds no state."""
    cfg = model_config(tie_output=False, norm_first=True)
    fast, core = mt.fast.Transformer(cfg), mt.Transformer(cfg)
    assert type(fast).__bases__ == (mt.Transformer,)
    pairs = list(zip(core.named_modules(), fast.named_modules()))[1:]     # below the root
    assert len(pairs) + 1 == len(core.modules()) == len(fast.modules())
    for (name, c), (fname, f) in pairs:
        assert name == fname
        assert type(f) is FAST_TWINS.get(type(c), type(c)), name
        assert set(vars(f)) == set(vars(c)), name            # same attributes: the twin holds nothing more
    untied = {cls for base, cls in FAST_TWINS.items() if base is not M.TiedProjection}
    assert {type(f) for f in fast.modules()} >= untied
    for base, cls in FAST_TWINS.items():                      # a subclass overriding only how it computes
        assert cls.__bases__ == (base,) and "__init__" not in vars(cls), cls


def test_make_fast_refuses_a_subclass_of_a_core_layer_loudly():
    """A student's subclass of a core layer would lose what it changes if its class were swapped, and could not
    take the fast model's packed rows if it stayed: make_fast names it instead of leaving it slow in silence."""
    class LoudAttention(L.MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            return 2 * super().forward(query, key, value, mask)

    core = M.EncoderLayer(10, 2, 7)
    core.self_attn = LoudAttention(10, 2)
    with pytest.raises(TypeError, match=r"^mt\.fast\.make_fast: self_attn is a LoudAttention, a subclass of the "
                                        r"core MultiHeadAttention; .* subclass minitransformer\.fast\.layers\."
                                        r"MultiHeadAttention instead$"):
        mt.fast.make_fast(core)
    assert type(core.self_attn) is LoudAttention                # never given the twin's forward
    with pytest.raises(TypeError, match=r"^mt\.fast\.make_fast: the module is a LoudAttention"):
        mt.fast.make_fast(LoudAttention(10, 2))


def test_make_fast_keeps_fast_classes_and_their_subclasses_and_returns_the_module():
    class MyFastAttention(mt.fast.layers.MultiHeadAttention):
        pass

    core = M.EncoderLayer(10, 2, 7)
    mine = core.self_attn = MyFastAttention(10, 2)
    W = core.ffn.W1.W                                          # the same Parameter objects after the swap
    assert mt.fast.make_fast(core) is core
    assert type(core) is FAST_TWINS[M.EncoderLayer] and core.self_attn is mine and type(mine) is MyFastAttention
    assert type(core.ffn) is mt.fast.layers.PositionwiseFeedForward and core.ffn.W1.W is W
    assert type(core.sublayer_attn) is L.SublayerConnection    # no twin: as it was
    assert type(core.sublayer_attn.norm) is mt.fast.layers.LayerNorm


@pytest.mark.parametrize("put_in", ["layer", "attention"])
def test_a_core_layer_put_into_a_fast_model_is_named_or_made_fast(float64, rng, put_in):
    """A core layer placed in a fast model after it was built: the next pass (forward or encode) names it in a
    clear TypeError, not one about packing; make_fast(model) then makes the model equal the core again."""
    core, fast = model_pair(model_config())
    if put_in == "layer":
        fast.decoder.layers._modules["1"] = copy.deepcopy(core.decoder.layers[1])
        where, cls = "decoder.layers.1", "DecoderLayer"
    else:
        fast.encoder.layers[0].self_attn = copy.deepcopy(core.encoder.layers[0].self_attn)
        where, cls = "encoder.layers.0.self_attn", "MultiHeadAttention"
    src, tgt_in, _ = model_batch(rng)
    message = rf"^mt\.fast\.Transformer: {re.escape(where)} is the core {cls}, not its fast twin \(mt\.fast\.make_fast"
    with pytest.raises(TypeError, match=message):
        fast(src, tgt_in)
    with pytest.raises(TypeError, match=message):
        fast.eval().encode(src)
    fast.clear_caches()
    fast.train()
    mt.fast.make_fast(fast)
    real = tgt_in != PAD
    assert_rel(host(fast(src, tgt_in))[real], host(core(src, tgt_in))[real], "logits once made fast")


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_encode_and_decoding_equal_the_core(float64, rng, norm_first):
    """encode at the real source positions (zero rows at the padded ones), and greedy and beam decoding,
    cached and naive, token for token."""
    cfg = model_config(tie_output=False, norm_first=norm_first)
    mt.manual_seed(3)
    core = perturb(mt.Transformer(cfg)).eval()
    # A random Transformer tends to repeat one token; centring every token's mean logit over random inputs
    # makes the decoded sequences varied, so that equal outputs say something.
    src, tgt_in = rng.integers(3, 11, size=(32, 7)), rng.integers(3, 11, size=(32, 6))
    core.projection.b.data -= core(src, tgt_in).mean(axis=(0, 1))   # (V,) on the backend
    fast = mt.fast.Transformer(cfg).eval()
    fast.load_state_dict(core.state_dict())
    src = padded_ids(rng, [7, 3, 5, 1, 6], T=7)
    core_memory, fast_memory = host(core.encode(src)), host(fast.encode(src))
    assert_rel(fast_memory[src != PAD], core_memory[src != PAD], "memory at the real source positions")
    assert np.all(fast_memory[src == PAD] == 0)
    outputs = {}
    for name, model in (("core", core), ("fast", fast)):
        outputs[name] = [mt.decoding.greedy_decode(model, src, max_len=8),
                         mt.decoding.greedy_decode(model, src, max_len=8, naive=True),
                         mt.decoding.beam_search(model, src, beam_size=3, max_len=8),
                         mt.decoding.beam_search(model, src, beam_size=2, alpha=0.0, max_len=8, naive=True)]
    assert outputs["fast"] == outputs["core"]
    greedy = outputs["core"][0]
    assert len({tuple(h) for h in greedy}) >= 3 and any(len(set(h)) > 1 for h in greedy)   # varied outputs


def test_checkpoints_move_between_the_tiers(float64, rng, tmp_path):
    """A core checkpoint trains on in the fast tier and back: weights through save_checkpoint, and the
    optimiser state from one tier's Adam into the other's, give the same next steps."""
    cfg = model_config(tie_output=False, share_embeddings=True)
    src, tgt_in, tgt_out = model_batch(rng, vocab=13)

    def train(model, loss_fn, opt, steps):
        for _ in range(steps):
            loss = loss_fn(model(src, tgt_in), tgt_out)
            model.backward(loss_fn.backward())
            opt.step()
            opt.zero_grad()
        return loss

    tiers = {"core": (mt.Transformer, mt.CrossEntropyLoss, mt.optim.Adam),
             "fast": (mt.fast.Transformer, mt.fast.CrossEntropyLoss, mt.fast.Adam)}
    for first, second in (("core", "fast"), ("fast", "core")):
        mt.manual_seed(0)
        Model, Loss, Adam = tiers[first]
        model = Model(cfg)
        opt = Adam(model.parameters(), lr=1e-2, eps=1e-6)
        train(model, Loss(PAD, 0.1), opt, 2)
        path = ck.save_checkpoint(tmp_path / f"{first}.npz", weights=model.state_dict(), optimizer=opt.state_dict())
        loaded = ck.load_checkpoint(path)
        runs = {}
        for tier in (first, second):                          # two more steps in each tier, from the checkpoint
            Model, Loss, Adam = tiers[tier]
            resumed = Model(cfg)
            resumed.load_state_dict(loaded.weights)
            assert list(resumed.state_dict()) == list(loaded.weights)
            resumed_opt = Adam(resumed.parameters(), lr=1e-2, eps=1e-6)
            resumed_opt.load_state_dict(loaded.optimizer)
            loss = train(resumed, Loss(PAD, 0.1), resumed_opt, 2)
            runs[tier] = (loss, resumed.state_dict(), resumed_opt.state_dict())
        assert abs(runs[second][0] - runs[first][0]) <= REL_TOL * runs[first][0]
        for name, w in runs[first][1].items():
            np.testing.assert_allclose(runs[second][1][name], w, rtol=1e-10, atol=1e-12, err_msg=name)
        assert runs[second][2].keys() == runs[first][2].keys() and runs[second][2]["step"] == 4
        for key, value in runs[first][2].items():
            np.testing.assert_allclose(runs[second][2][key], value, rtol=1e-9, atol=1e-15, err_msg=key)


def test_state_dict_round_trip_core_fast_core(float64):
    cfg = model_config(tie_output=False, norm_first=True, positional="learned")
    core, fast = model_pair(cfg)
    state = core.state_dict()
    assert list(fast.state_dict()) == list(state)
    back = mt.Transformer(cfg)
    back.load_state_dict(fast.state_dict())
    for name, w in back.state_dict().items():
        np.testing.assert_array_equal(w, state[name], err_msg=name)


# ============================================================ each fast piece against its core twin

def compare_twins(core, args, dout, *, fast=None, fast_args=None, fast_kwargs=None, out_rows=None,
                  grad_rows=None, tol=REL_TOL):
    """core(*args) and core.backward(dout) against the fast twin called on fast_args (default: copies of
    args) and given dout (packed by out_rows where its output is packed): the output, every input
    gradient (packed by grad_rows[i]) and every parameter gradient. The fast twin must leave its inputs
    as they were."""
    fast = fast_twin(core) if fast is None else fast
    fast_args = [a.copy() if mt.backend.is_array(a) else a for a in args] if fast_args is None else fast_args
    grad_rows = grad_rows or [None] * len(args)
    before = [host(a).copy() if mt.backend.is_array(a) else None for a in fast_args]

    core_out = core(*args)
    core_grads = as_list(core.backward(dout.copy()))
    fast_out = fast(*fast_args, **(fast_kwargs or {}))
    fast_grads = as_list(fast.backward(out_rows.pack(dout) if out_rows is not None else dout.copy()))

    assert_rel(fast_out, out_rows.pack(core_out) if out_rows is not None else core_out, "output", tol)
    assert len(fast_grads) == len(core_grads)
    for i, (g_fast, g_core) in enumerate(zip(fast_grads, core_grads)):
        rows = grad_rows[i]
        assert_rel(g_fast, rows.pack(g_core) if rows is not None else g_core, f"gradient of input {i}", tol)
    assert_same_grads(core, fast, tol)
    for i, (a, b) in enumerate(zip(fast_args, before)):
        if b is not None:
            np.testing.assert_array_equal(host(a), b, err_msg=f"the fast twin changed its input {i}")
    return fast_out


# Shapes: odd and distinct where the model allows (D is even only where positions are sinusoidal pairs).
B, TQ, TK, D, H, F = 3, 5, 7, 9, 3, 13
Q_LENGTHS, K_LENGTHS = [5, 2, 4], [3, 7, 1]


def normal(rng, shape):
    """Standard normal draws on the session's backend."""
    return dev(rng.standard_normal(shape))


def attention_inputs(rng, kind):
    """query, key, value (grids) for self, cross or separate attention, their ids, and the model's mask."""
    q_ids = padded_ids(rng, Q_LENGTHS, T=TQ)
    query = normal(rng, (B, TQ, D))
    if kind == "self":
        return q_ids, q_ids, (query, query, query), padding_mask(q_ids, PAD) & subsequent_mask(TQ)
    k_ids = padded_ids(rng, K_LENGTHS, T=TK)
    key = normal(rng, (B, TK, D))
    value = key if kind == "cross" else normal(rng, (B, TK, D))
    return q_ids, k_ids, (query, key, value), padding_mask(k_ids, PAD)


def zero_padded(dout, ids):
    """A gradient that is 0 at the padded positions, as the loss makes it and as packing needs."""
    dout = host(dout).copy()
    dout[ids == PAD] = 0
    return dev(dout)


def case_linear(rng, bias):
    return {"core": perturb(L.Linear(D, 5, bias=bias)), "args": [normal(rng, (B, TK, D))],
            "dout": normal(rng, (B, TK, 5))}


def case_embedding(rng, scale):
    ids = dev(np.array([[1, 1, 4, 10, 0], [3, 1, 0, 0, 7], [10, 2, 2, 2, 5]]))   # repeats: the scatter-add sums them
    return {"core": L.Embedding(11, D, scale=scale), "args": [ids], "dout": normal(rng, (3, 5, D))}


def case_softmax(rng, axis):
    return {"core": L.Softmax(axis=axis), "args": [3 * normal(rng, (B, TQ, TK))],
            "dout": normal(rng, (B, TQ, TK))}


def case_sdpa(rng, scale):
    q, k, v = normal(rng, (B, 2, TQ, 4)), normal(rng, (B, 2, TK, 4)), normal(rng, (B, 2, TK, 6))
    mask = rng.random((B, 1, TQ, TK)) < 0.6                   # (B,1,Tq,Tk), broadcast over the heads
    mask[..., 0] = True
    mask[1, 0, 2] = False                                      # a query row with every key masked
    return {"core": L.ScaledDotProductAttention(scale=scale), "args": [q, k, v, dev(mask)],
            "dout": normal(rng, (B, 2, TQ, 6))}


def case_mha(rng, kind, packed, d_k, d_v=None):
    q_ids, k_ids, (query, key, value), mask = attention_inputs(rng, kind)
    core = perturb(L.MultiHeadAttention(D, H, d_k=d_k, d_v=d_v))
    dout = normal(rng, (B, TQ, D))
    if packed == "none":
        fast_query = query.copy()
        fast_key = fast_query if key is query else key.copy()
        fast_value = fast_key if value is key else value.copy()
        return {"core": core, "args": [query, key, value, mask], "dout": dout,
                "fast_args": [fast_query, fast_key, fast_value, mask]}
    q_rows = Packing(q_ids, PAD)
    k_rows = q_rows if kind == "self" else Packing(k_ids, PAD) if packed == "both" else None
    packed_query = q_rows.pack(query)
    pack_k = (lambda x: x.copy()) if k_rows is None else k_rows.pack
    packed_key = packed_query if kind == "self" else pack_k(key)
    packed_value = packed_key if value is key else pack_k(value)
    return {"core": core, "args": [query, key, value, mask], "dout": zero_padded(dout, q_ids),
            "fast_args": [packed_query, packed_key, packed_value, mask],
            "fast_kwargs": {"packing": (q_rows, k_rows)}, "out_rows": q_rows,
            "grad_rows": [q_rows, k_rows, k_rows]}


def case_ffn(rng):
    return {"core": perturb(L.PositionwiseFeedForward(D, F)), "args": [normal(rng, (B, TK, D))],
            "dout": normal(rng, (B, TK, D))}


def case_layernorm(rng):
    return {"core": perturb(L.LayerNorm(D)), "args": [2 + 3 * normal(rng, (B, TK, D))],
            "dout": normal(rng, (B, TK, D))}


def case_tied(rng):
    weight = mt.Parameter(normal(rng, (11, D)))
    return {"core": M.TiedProjection(weight), "args": [normal(rng, (B, TQ, D))],
            "dout": normal(rng, (B, TQ, 11))}


def case_dropout(rng, mode):
    core = L.Dropout(0.0 if mode == "p=0" else 0.3)
    if mode == "eval":
        core.eval()
    return {"core": core, "args": [normal(rng, (B, TQ, D))], "dout": normal(rng, (B, TQ, D))}


def case_stack(rng, which, packed, norm_first):
    """EncoderLayer, DecoderLayer, Encoder or Decoder (D 10, H 2, F 7) on a padded batch."""
    Dm, Hm, Fm = 10, 2, 7
    src_ids, tgt_ids = padded_ids(rng, K_LENGTHS, T=TK), padded_ids(rng, Q_LENGTHS, T=TQ)
    src_mask = padding_mask(src_ids, PAD)
    tgt_mask = padding_mask(tgt_ids, PAD) & subsequent_mask(TQ)
    memory, y = normal(rng, (B, TK, Dm)), normal(rng, (B, TQ, Dm))
    core = perturb({"EncoderLayer": lambda: M.EncoderLayer(Dm, Hm, Fm, norm_first=norm_first),
                    "DecoderLayer": lambda: M.DecoderLayer(Dm, Hm, Fm, norm_first=norm_first),
                    "Encoder": lambda: M.Encoder(2, Dm, Hm, Fm, norm_first=norm_first),
                    "Decoder": lambda: M.Decoder(2, Dm, Hm, Fm, norm_first=norm_first)}[which]())
    s_rows, t_rows = Packing(src_ids, PAD), Packing(tgt_ids, PAD)
    if which.startswith("Encoder"):
        case = {"core": core, "args": [memory, src_mask], "dout": normal(rng, (B, TK, Dm))}
        if packed:
            case.update(dout=zero_padded(case["dout"], src_ids), fast_args=[s_rows.pack(memory), src_mask],
                        fast_kwargs={"packing": s_rows}, out_rows=s_rows, grad_rows=[s_rows])
        return case
    case = {"core": core, "args": [y, memory, tgt_mask, src_mask], "dout": normal(rng, (B, TQ, Dm))}
    if packed:
        case.update(dout=zero_padded(case["dout"], tgt_ids),
                    fast_args=[t_rows.pack(y), s_rows.pack(memory), tgt_mask, src_mask],
                    fast_kwargs={"packing": (t_rows, s_rows)}, out_rows=t_rows, grad_rows=[t_rows, s_rows])
    return case


PIECES = {   # case id -> (core class, builder)
    "Linear": (L.Linear, lambda rng: case_linear(rng, bias=True)),
    "Linear-no-bias": (L.Linear, lambda rng: case_linear(rng, bias=False)),
    "Embedding": (L.Embedding, lambda rng: case_embedding(rng, scale=False)),
    "Embedding-scaled": (L.Embedding, lambda rng: case_embedding(rng, scale=True)),
    "Softmax": (L.Softmax, lambda rng: case_softmax(rng, axis=-1)),
    "Softmax-axis1": (L.Softmax, lambda rng: case_softmax(rng, axis=1)),
    "LayerNorm": (L.LayerNorm, case_layernorm),
    "SDPA": (L.ScaledDotProductAttention, lambda rng: case_sdpa(rng, scale=True)),
    "SDPA-unscaled": (L.ScaledDotProductAttention, lambda rng: case_sdpa(rng, scale=False)),
    "FFN": (L.PositionwiseFeedForward, case_ffn),
    "TiedProjection": (M.TiedProjection, case_tied),
    "Dropout-p0": (L.Dropout, lambda rng: case_dropout(rng, "p=0")),
    "Dropout-eval": (L.Dropout, lambda rng: case_dropout(rng, "eval")),
    **{f"MHA-{kind}-{packed}-dk{d_k}" + (f"-dv{d_v}" if d_v else ""): (
        L.MultiHeadAttention, lambda rng, k=kind, p=packed, dk=d_k, dv=d_v: case_mha(rng, k, p, dk, dv))
       for kind in ("self", "cross", "separate") for packed in ("none", "both")
       for d_k, d_v in ((None, None), (5, None), (5, 2))},
    "MHA-cross-query-packed": (L.MultiHeadAttention, lambda rng: case_mha(rng, "cross", "query", None)),
    **{f"{which}-{'packed' if packed else 'grid'}-{'preLN' if nf else 'postLN'}": (
        getattr(M, which), lambda rng, w=which, p=packed, n=nf: case_stack(rng, w, p, n))
       for which in ("EncoderLayer", "DecoderLayer", "Encoder", "Decoder")
       for packed in (False, True) for nf in (False, True)},
}


@pytest.mark.parametrize("case", list(PIECES))
def test_fast_piece_equals_its_core_twin(float64, rng, case):
    cls, build = PIECES[case]
    kwargs = build(rng)
    assert type(kwargs["core"]) is cls
    compare_twins(**kwargs)


def test_every_fast_twin_is_compared_with_its_core_class():
    # ReLU has tests of its own below (its out= argument), Dropout's training rule too.
    assert {cls for cls, _ in PIECES.values()} | {L.ReLU} == set(FAST_TWINS)


@pytest.mark.parametrize("in_place", [False, True])
def test_fast_relu_equals_the_core_with_and_without_out(float64, rng, in_place):
    x = rng.standard_normal((B, TQ, D))
    x[0, 0, :3] = 0.0                                          # at the kink: the derivative taken as 0 on both
    x, dout = dev(x), normal(rng, x.shape)
    core, fast = L.ReLU(), mt.fast.layers.ReLU()
    expected, expected_dx = host(core(x)), host(core.backward(dout))
    fx, fdout = x.copy(), dout.copy()
    out = fast(fx, out=fx) if in_place else fast(fx)
    dx = fast.backward(fdout, out=fdout) if in_place else fast.backward(fdout)
    np.testing.assert_array_equal(host(out), expected)
    np.testing.assert_array_equal(host(dx), expected_dx)
    if in_place:
        assert out is fx and dx is fdout
    else:                                                      # the inputs as they were
        np.testing.assert_array_equal(host(fx), host(x))
        np.testing.assert_array_equal(host(fdout), host(dout))


def test_fast_attention_weights_and_the_empty_row(float64, rng):
    """.attn is the core's, and a query row with every key masked gets zero weights and output."""
    case = case_sdpa(rng, scale=True)
    fast = fast_twin(case["core"])
    out = compare_twins(fast=fast, **case)
    attn, out = host(fast.attn), host(out)
    assert_rel(attn, case["core"].attn, "attention weights")
    assert np.all(attn[1, :, 2] == 0) and np.all(out[1, :, 2] == 0)


# ============================================================================= dropout's own rule

def test_fast_dropout_rate_is_p_to_within_2_to_the_minus_17(monkeypatch, float64):
    """An element is dropped when its 16-bit draw is below round(p * 65536): fed every 16-bit value once,
    the dropped share is that threshold / 65536, within 2^-17 of p, and the kept ones are x / (1 - p)."""
    every_value = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    monkeypatch.setattr(mt.fast.layers, "random_uint16", lambda shape: dev(every_value.reshape(shape)))
    x = dev(np.ones((256, 256)))
    for p in (0.1, 1 / 3, 0.5, 0.9, 0.99999, 1e-6):
        out = host(mt.fast.layers.Dropout(p).forward(x))
        dropped = float(np.mean(out == 0))
        assert abs(dropped - p) <= 2.0 ** -17, (p, dropped)
        np.testing.assert_array_equal(out[out != 0], 1.0 / (1.0 - p))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fast_dropout_is_reproducible_and_keeps_the_expectation(float64, p):
    n = 999 * 1001
    x = dev(np.ones((999, 1001)))
    drop = mt.fast.layers.Dropout(p)
    mt.manual_seed(5)
    out = host(drop(x))
    dout = np.random.default_rng(0).standard_normal(x.shape)
    dx = host(drop.backward(dev(dout)))
    mt.manual_seed(5)
    np.testing.assert_array_equal(host(drop(x)), out)         # the same seed, the same mask
    drop.backward(dev(dout))
    assert not np.array_equal(host(drop(x)), out)              # the next draw, another mask
    kept = out != 0
    np.testing.assert_array_equal(out[kept], 1.0 / (1.0 - p))
    np.testing.assert_array_equal(dx, np.where(kept, dout * (1.0 / (1.0 - p)), 0.0))   # backward reuses the mask
    # Bounds of 5 binomial standard deviations, for the dropped share and for the mean of out (E[out] = x).
    assert abs((1 - kept.mean()) - p) < 5 * np.sqrt(p * (1 - p) / n)
    assert abs(out.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / n)


# ================================================================================== the fused loss

@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fast_loss_equals_the_core(rng, label_smoothing, dtype):
    V = 11
    logits = dev((4 * rng.standard_normal((B, TK, V))).astype(dtype))
    target = rng.integers(0, V, size=(B, TK))
    target[0, 4:] = PAD                                       # ignored rows
    target[2, :] = PAD
    core_fn = mt.CrossEntropyLoss(ignore_index=PAD, label_smoothing=label_smoothing)
    fast_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD, label_smoothing=label_smoothing)
    core_loss, fast_loss = core_fn(logits, target), fast_fn(logits.copy(), target)
    core_grad, fast_grad = host(core_fn.backward()), host(fast_fn.backward())
    assert fast_fn.num_tokens == core_fn.num_tokens == int((target != PAD).sum())
    assert fast_grad.dtype == core_grad.dtype == logits.dtype
    # float32: both sum V terms per row in float32 (relative rounding ~ V * 6e-8); float64: rounding only.
    tol = 1e-5 if dtype == "float32" else REL_TOL
    assert abs(fast_loss - core_loss) <= tol * core_loss
    assert_rel(fast_grad, core_grad, "dlogits", tol)
    assert np.all(fast_grad[target == PAD] == 0)
    with pytest.raises(RuntimeError, match="call forward first"):
        fast_fn.backward()


def test_fast_loss_of_an_all_padding_batch_is_zero(rng):
    logits = normal(rng, (2, 3, 5))
    fast_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    padding = np.zeros((2, 3), dtype=int)
    assert fast_fn(logits, padding) == 0.0 == mt.CrossEntropyLoss(PAD, 0.1)(logits, padding)
    assert fast_fn.num_tokens == 0 and not host(fast_fn.backward()).any()


def test_fast_loss_keeps_the_cores_argument_checks(rng):
    fast_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD)
    with pytest.raises(ValueError, match=r"target must hold class ids in \[0, 5\)"):
        fast_fn(normal(rng, (2, 3, 5)), np.array([[1, 2, 5], [0, 0, 1]]))


# ========================================================================================== Adam

SHAPES = [(3, 5), (7,), (2 * CPU_CHUNK + 7,), (5, 3, 11)]     # one parameter over several CPU slices


def adam_params(seed, shapes=SHAPES):
    """Parameters with one non-contiguous among them (a transposed view: its own path in the fast Adam)."""
    rng = np.random.default_rng(seed)
    params = [mt.Parameter(dev(rng.normal(size=s))) for s in shapes]
    params.append(mt.Parameter(dev(rng.normal(size=(9, 13))).T))     # (13, 9), F-ordered
    assert not params[-1].data.flags.c_contiguous
    return params


def adam_grads(rng, params):
    return [rng.normal(scale=10.0 ** rng.uniform(-3, 1), size=p.data.shape) for p in params]


def run_adam(Adam, threads, weight_decay, steps=4, seed=3):
    mt.fast.set_num_threads(threads)
    params = adam_params(seed)
    opt = Adam(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
    rng = np.random.default_rng(4)
    for _ in range(steps):
        grads = adam_grads(rng, params)
        for p, g in zip(params, grads):
            p.grad[...] = dev(g)
        opt.step()
        for p, g in zip(params, grads):
            np.testing.assert_array_equal(host(p.grad), g)     # the update leaves the gradient as it was
    return params, opt


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("threads", [1, 3])
def test_fast_adam_equals_the_core(float64, weight_decay, threads):
    core_params, core_opt = run_adam(mt.optim.Adam, 1, weight_decay)
    fast_params, fast_opt = run_adam(mt.fast.Adam, threads, weight_decay)
    for i, (p, q) in enumerate(zip(core_params, fast_params)):
        np.testing.assert_allclose(host(q.data), host(p.data), rtol=1e-13, atol=1e-15, err_msg=f"parameter {i}")
    start = adam_params(3)
    assert all(not np.array_equal(host(p.data), host(s.data)) for p, s in zip(core_params, start))   # all moved
    core_state, fast_state = core_opt.state_dict(), fast_opt.state_dict()
    assert core_state.keys() == fast_state.keys() and fast_state["step"] == 4
    for key, value in core_state.items():
        np.testing.assert_allclose(fast_state[key], value, rtol=1e-13, atol=0, err_msg=key)


@cpu_only
@pytest.mark.parametrize("threads", [2, 3])
def test_fast_adam_on_several_threads_gives_bitwise_the_one_thread_update(threads):
    # Slices of CPU_CHUNK elements are shared out among the threads: several slices, a partial last one,
    # a parameter smaller than one slice, a non-contiguous one, and a float32 parameter next to float64
    # ones (one work buffer each).
    runs = []
    for n in (1, threads):
        mt.fast.set_num_threads(n)
        params = adam_params(3) + [mt.Parameter(np.linspace(-1, 1, 1001, dtype=np.float32))]
        opt = mt.fast.Adam(params, lr=1e-2, weight_decay=0.01)
        rng = np.random.default_rng(4)
        for _ in range(3):
            for p, g in zip(params, adam_grads(rng, params)):
                p.grad[...] = g
            opt.step()
        runs.append([p.data.copy() for p in params])
    for one, many in zip(*runs):
        assert one.dtype == many.dtype
        np.testing.assert_array_equal(one, many)


@pytest.mark.parametrize("first, second", [("core", "fast"), ("fast", "core")])
def test_adam_state_dicts_are_interchangeable(float64, first, second):
    """Two steps in one tier, the state into the other tier's Adam, two more steps: the same as four steps
    in the first tier."""
    tiers = {"core": mt.optim.Adam, "fast": mt.fast.Adam}
    rng = np.random.default_rng(5)
    reference = adam_params(3)
    ref_opt = tiers[first](reference, lr=1e-2, weight_decay=0.01)
    draws = []
    for k in range(4):
        draws.append(adam_grads(rng, reference))
        for p, g in zip(reference, draws[k]):
            p.grad[...] = dev(g)
        ref_opt.step()
        if k == 1:
            saved, weights = ref_opt.state_dict(), [p.data.copy() for p in reference]
    params = adam_params(3)
    for p, w in zip(params, weights):
        p.data[...] = w
    opt = tiers[second](params, lr=1.0, weight_decay=0.01)
    opt.load_state_dict(saved)
    assert opt.step_count == 2 and opt.lr == 1e-2
    for grads in draws[2:]:
        for p, g in zip(params, grads):
            p.grad[...] = dev(g)
        opt.step()
    for i, (p, q) in enumerate(zip(reference, params)):
        np.testing.assert_allclose(host(q.data), host(p.data), rtol=1e-13, atol=1e-15, err_msg=f"parameter {i}")


# ===================================================================== Packing: pack, unpack, attention

def test_pack_takes_the_real_tokens_in_reading_order_and_unpack_puts_them_back(rng):
    ids = padded_ids(rng, [4, 1, 0, 3], T=5)
    ids[3, 1] = PAD                                            # padding inside a sentence too
    rows = Packing(ids, PAD)
    assert rows.size == int((ids != PAD).sum()) == 7 and rows.shape == (4, 5)
    x = rng.standard_normal((4, 5, 6))
    packed = rows.pack(dev(x))
    np.testing.assert_array_equal(host(packed), x[ids != PAD])       # boolean indexing reads in C order
    grid = host(rows.unpack(packed))
    assert grid.shape == (4, 5, 6)
    np.testing.assert_array_equal(grid[ids != PAD], x[ids != PAD])
    assert np.all(grid[ids == PAD] == 0)
    np.testing.assert_array_equal(host(rows.pack(dev(ids))), ids[ids != PAD])   # no trailing axes: (B,T) -> (N,)


@cpu_only
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


@pytest.mark.parametrize("d_v", [None, 3])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_attention_on_packed_rows_gradcheck(float64, rng, kind, d_v):
    q_ids, k_ids, (query, key, _value), mask = attention_inputs(rng, kind)
    q_rows = Packing(q_ids, PAD)
    k_rows = q_rows if kind == "self" else Packing(k_ids, PAD)
    packed_query, packed_key = q_rows.pack(query), k_rows.pack(key)
    mha = perturb(fast_twin(L.MultiHeadAttention(D, H, d_k=4, d_v=d_v)))
    report = mt.gradcheck.check(mha, packed_query, packed_key, packed_key.copy(), mask, (q_rows, k_rows),
                                max_entries=20)
    report.assert_ok(1e-6)
    assert {"input[0]", "input[1]", "input[2]"} <= {r.name for r in report.rows}


def test_attention_checks_packed_shapes_and_the_packing(float64, rng):
    q_ids, k_ids, (query, key, _), mask = attention_inputs(rng, "cross")
    q_rows, k_rows = Packing(q_ids, PAD), Packing(k_ids, PAD)
    mha = fast_twin(L.MultiHeadAttention(D, H))
    with pytest.raises(ValueError, match=r"query is packed, so it must have shape \(N=11 real tokens"):
        mha(query, k_rows.pack(key), k_rows.pack(key), mask, (q_rows, k_rows))
    with pytest.raises(TypeError, match="packing must be a pair"):
        mha(query, key, key, mask, q_rows)
    with pytest.raises(ValueError, match="mask"):              # the core's checks, on the grids packed rows stand for
        mha(q_rows.pack(query), k_rows.pack(key), k_rows.pack(key), mask[:, :, :, :3], (q_rows, k_rows))
    out = mha(q_rows.pack(query), k_rows.pack(key), k_rows.pack(key), mask, (q_rows, k_rows))   # and passes
    assert out.shape == (q_rows.size, D)


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_batch_equals_each_sentence_alone(float64, rng, norm_first):
    """The fast model's logits at the real positions, and the gradient of every parameter, are those of
    running each sentence by itself with no padding anywhere (summed over the sentences, as the batch's are)."""
    cfg = model_config(tie_output=True, norm_first=norm_first)
    mt.manual_seed(0)
    model = perturb(mt.fast.Transformer(cfg))
    src_len, tgt_len = [6, 2, 4], [3, 5, 1]
    src, tgt_in = padded_ids(rng, src_len, T=7), padded_ids(rng, tgt_len, T=6)
    tgt_in[:, 0] = 1                                           # BOS
    dlogits = zero_padded(rng.standard_normal((3, 6, 11)), tgt_in)   # as a loss that ignores padding gives

    logits = host(model(src, tgt_in))
    model.backward(dlogits)
    batch_grads = [host(p.grad).copy() for p in model.parameters()]
    model.zero_grad()
    for b in range(3):
        alone = model(src[b:b + 1, :src_len[b]], tgt_in[b:b + 1, :tgt_len[b]])   # (1, t, V), no padding
        np.testing.assert_allclose(logits[b, :tgt_len[b]], host(alone)[0], rtol=0, atol=1e-12)
        model.backward(dlogits[b:b + 1, :tgt_len[b]])          # grads add up over the three sentences
    for (name, p), expected in zip(model.named_parameters(), batch_grads):
        if name.endswith(ZERO_BY_MATH):
            assert np.abs(host(p.grad)).max() < ZERO_GRAD_ATOL and np.abs(expected).max() < ZERO_GRAD_ATOL
        else:
            assert_rel(p.grad, expected, f"gradient of {name}")


def test_fast_transformer_gradcheck_with_dropout(float64, rng):
    """With dropout on, fast and core draw different masks, so no twin comparison: the fast model's backward
    is checked against its own forward instead (gradcheck replays the same masks at every forward), padded
    positions included (their logits are constants of the zero vector's projection: the bias)."""
    cfg = mt.TransformerConfig(11, 11, d_model=6, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=5,
                               dropout=0.3, max_len=8, tie_output=False)
    mt.manual_seed(2)
    model = perturb(mt.fast.Transformer(cfg))
    src, tgt_in = padded_ids(rng, [5, 2, 4], T=5), padded_ids(rng, [3, 1, 2], T=3)
    report = mt.gradcheck.check(model, src, tgt_in, max_entries=4)
    report.assert_ok(1e-6)
    assert len(report.rows) == len(model.parameters())


# ======================================================================= stacked projections

def test_stacked_linear_equals_the_separate_layers(float64, rng):
    # The fused projection (one matmul, one bias add, one bias sum) must give exactly what the layers give
    # one by one, also for a layer without bias and for unequal widths.
    linears = [perturb(L.Linear(5, 3)), L.Linear(5, 4, bias=False), perturb(L.Linear(5, 2), seed=8)]
    x = normal(rng, (2, 7, 5))
    douts = [rng.standard_normal((2, 7, lin.out_features)) for lin in linears]

    expected_out = [lin(x) for lin in linears]
    expected_dx = [lin.backward(dev(d)) for lin, d in zip(linears, douts)]
    expected_grads = [host(p.grad).copy() for lin in linears for p in lin.parameters()]
    for lin in linears:
        lin.zero_grad()

    out = mt.fast.stacked_linear(x, linears)
    assert out.shape == (2, 7, 9)
    dxs = mt.fast.stacked_linear_backward(x, linears, dev(np.concatenate(douts, axis=-1)))
    np.testing.assert_allclose(host(out), np.concatenate([host(o) for o in expected_out], axis=-1),
                               rtol=1e-13, atol=1e-13)
    for got, want in zip(dxs, expected_dx):
        assert got.shape == want.shape
        np.testing.assert_allclose(host(got), host(want), rtol=1e-13, atol=1e-13)
    for got, want in zip([p.grad for lin in linears for p in lin.parameters()], expected_grads):
        np.testing.assert_allclose(host(got), want, rtol=1e-13, atol=1e-13)


# ======================================================================================= random_uint16

@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (0, 4), (512, 1031)])
def test_random_uint16_shape_dtype_and_reproducible(shape):
    mt.manual_seed(3)
    a = mt.fast.random_uint16(shape)
    mt.manual_seed(3)
    b = mt.fast.random_uint16(shape)
    assert a.shape == shape and a.dtype == np.uint16
    np.testing.assert_array_equal(host(a), host(b))
    if a.size > 1:
        assert not np.array_equal(host(a), host(mt.fast.random_uint16(shape)))   # the next call draws new numbers


@cpu_only
def test_random_uint16_is_uniform_and_its_neighbours_independent():
    # The CPU path cuts four 16-bit integers from each 64-bit draw: every bit, every value range and every
    # pair of neighbours (inside one word and across words) must look like independent uniform draws.
    mt.manual_seed(0)
    n = 1 << 22
    r = mt.fast.random_uint16((n,)).astype(np.int64)
    for bit in range(16):                                                # 5 sigma per bit
        assert abs(((r >> bit) & 1).mean() - 0.5) < 5 * 0.5 / np.sqrt(n), bit
    counts = np.bincount(r >> 8, minlength=256)                          # the high byte: 256 equal bins
    expected = n / 256
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 255 + 6 * np.sqrt(2 * 255)                             # chi-square, 255 dof, ~6 sigma
    for position in range(4):                                            # each quarter of the 64-bit words
        quarter = r[position::4]
        assert abs(quarter.mean() - 32767.5) < 5 * 18918 / np.sqrt(quarter.size)   # std of U{0..65535}
    x = (r - 32767.5) / 18918.6
    for lag in (1, 2, 3, 4, 5):
        assert abs(np.mean(x[:-lag] * x[lag:])) < 5 / np.sqrt(n)         # correlation of neighbours ~ 0


# ======================================================================================== the thread pool

def blas_counts() -> list:
    """The thread count of every BLAS in this process, as threadpoolctl itself reads it."""
    return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture
def no_blas_variables(monkeypatch):
    for var in fast_threads.BLAS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def test_blas_threads_are_set_through_threadpoolctl_and_restored(no_blas_variables):
    before = blas_counts()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS in this process")
    try:
        assert fast_threads.use_blas_threads(1) == (1, "chosen")
        assert blas_counts() == [1] * len(before) and fast_threads.blas_threads() == 1
        default = fast_threads._blas_controller()[1]           # the count the BLAS started with
        assert fast_threads.use_blas_threads(None) == (default, "default") and default is not None
        assert blas_counts() == [default] * len(before)
        fast_threads.set_blas_threads(1)
        assert blas_counts() == [1] * len(before)
    finally:
        fast_threads.set_blas_threads(before[0])
    assert blas_counts() == before


def test_a_blas_count_in_the_environment_wins(monkeypatch, no_blas_variables):
    before = blas_counts()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS in this process")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert fast_threads.use_blas_threads(1) == (before[0], "OPENBLAS_NUM_THREADS")   # the first of BLAS_ENV_VARS set
    assert blas_counts() == before                             # left alone
    # Where the variable was there when the process started, the BLAS runs with it and the program keeps it.
    code = ("from minitransformer.fast import threads; import threadpoolctl; print(threads.use_blas_threads(2), "
            "[lib['num_threads'] for lib in threadpoolctl.threadpool_info() if lib['user_api'] == 'blas'])")
    env = {k: v for k, v in os.environ.items() if k not in fast_threads.BLAS_ENV_VARS}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"(1, 'OPENBLAS_NUM_THREADS') {[1] * len(before)}"


def test_without_a_blas_threadpoolctl_can_set_nothing_is_touched_and_one_line_says_so(monkeypatch,
                                                                                      no_blas_variables):
    before = blas_counts()
    nothing = threadpoolctl.ThreadpoolController().select(user_api="none")   # as with Accelerate: no BLAS found
    monkeypatch.setattr(fast_threads, "_blas_controller", lambda: (nothing, None))
    assert fast_threads.blas_threads() is None
    assert fast_threads.set_blas_threads(1) is False
    assert fast_threads.use_blas_threads(1) == (None, "unknown") and fast_threads.use_blas_threads(None) == (None, "unknown")
    assert blas_counts() == before
    assert "\n" not in fast_threads.NO_BLAS_CONTROL and "threadpoolctl finds no BLAS" in fast_threads.NO_BLAS_CONTROL
    with pytest.raises(ValueError, match="set_blas_threads: n must be a positive int"):
        fast_threads.set_blas_threads(0)


def test_thread_count_from_the_environment_and_checked():
    code = "import minitransformer as mt; print(mt.fast.get_num_threads())"
    base = {"PATH": "/usr/bin:/bin"}
    for env, expected in (({"MINITRANSFORMER_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, "3"),
                          ({"OPENBLAS_NUM_THREADS": "1"}, "1"),
                          ({"OMP_NUM_THREADS": "5", "OPENBLAS_NUM_THREADS": "1"}, "5")):
        out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == expected, env
    for bad in (0, -1, 1.5, "2", True, None):
        with pytest.raises(ValueError, match=r"set_num_threads: n must be a positive int, got"):
            mt.fast.set_num_threads(bad)


@cpu_only
def test_parallel_map_keeps_order_and_really_runs_concurrently():
    mt.fast.set_num_threads(3)
    # Each call waits until three calls are inside it at once: run one after another, they would time out.
    barrier = threading.Barrier(3, timeout=10)

    def work(i):
        barrier.wait()
        return i * i, threading.current_thread().name

    results = mt.fast.parallel_map(work, range(3))
    assert [r[0] for r in results] == [0, 1, 4]
    assert len({r[1] for r in results}) == 3
    # Called from inside a parallel_map (every pool thread busy with the outer call), it runs inline.
    mt.fast.set_num_threads(2)
    both_busy = threading.Barrier(2, timeout=10)

    def outer(i):
        both_busy.wait()                                       # both pool threads are in an outer call now
        return mt.fast.parallel_map(lambda j: i * 10 + j, range(3))

    nested = []
    caller = threading.Thread(target=lambda: nested.append(mt.fast.parallel_map(outer, range(2))), daemon=True)
    caller.start()
    caller.join(timeout=20)
    assert not caller.is_alive(), "a parallel_map inside a parallel_map waited for itself"
    assert nested == [[[0, 1, 2], [10, 11, 12]]]
    mt.fast.set_num_threads(1)                                 # one thread: the plain loop, in this thread
    assert mt.fast.parallel_map(lambda i: threading.current_thread().name, range(3)) == \
        [threading.current_thread().name] * 3


@cpu_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
# Python 3.12+ warns at any fork of a process with threads: forking with the pool's threads alive is the point here.
@pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning")
def test_parallel_map_works_in_a_forked_child():
    # The parent's pool exists (and its threads do not, in the child): the child must not wait for them.
    mt.fast.set_num_threads(2)
    assert mt.fast.parallel_map(lambda i: i + 1, range(4)) == [1, 2, 3, 4]
    pid = os.fork()
    if pid == 0:                                               # the child: exit 0 only if the work got done
        ok = mt.fast.parallel_map(lambda i: i + 1, range(4)) == [1, 2, 3, 4]
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("parallel_map hung in a forked child")


# ============================================================================ on a device backend



def fast_training_step(name, steps=2, dropout=0.0):
    """``steps`` steps of the fast tier (model, fused loss, flat Adam) on backend `name`: what they produce as
    host arrays, the model, the optimiser, and (on the fake) the size of every device-to-host copy."""
    use(name)
    mt.manual_seed(0)
    model = mt.fast.Transformer(mt.TransformerConfig(13, 11, d_model=10, num_heads=2, num_encoder_layers=2,
                                                     num_decoder_layers=2, d_ff=7, dropout=dropout, max_len=12))
    loss_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    # eps 1e-6: the key bias's gradient is rounding noise, which a tiny eps would turn into a full step.
    opt = mt.fast.Adam(model.parameters(), lr=1e-3, eps=1e-6, weight_decay=0.01)
    src, tgt_in, tgt_out = model_batch(np.random.default_rng(1))
    out, host_sizes = {"loss": []}, []
    for _ in range(steps):
        fakecupy.transfers.reset()
        logits = model(src, tgt_in)                            # host ids, as a data loader gives them
        out["loss"].append(loss_fn(logits, tgt_out))
        dlogits = loss_fn.backward()
        model.backward(dlogits)
        opt.step()
        host_sizes += fakecupy.transfers.host_sizes
        out["logits"] = mt.to_numpy(logits).copy()
        out.update({f"grad {n}": mt.to_numpy(p.grad).copy() for n, p in model.named_parameters()})
        opt.zero_grad()
    out.update({f"weight {n}": w for n, w in model.state_dict().items()})
    out.update({f"adam {k}": v for k, v in opt.state_dict().items()})
    return out, model, opt, host_sizes, (logits, dlogits)


def test_fast_training_step_on_a_device_equals_numpy(device, float64):
    expected = fast_training_step("numpy")[0]
    actual, model, opt, host_sizes, _ = fast_training_step(device)
    assert set(actual) == set(expected)
    for key in expected:
        np.testing.assert_allclose(actual[key], expected[key], err_msg=key, **TOLERANCE[device])
    xp = mt.backend.xp()
    for name, p in model.named_parameters():
        assert isinstance(p.data, xp.ndarray) and isinstance(p.grad, xp.ndarray), name
    assert all(isinstance(a, xp.ndarray) for arrays in opt.state.values() for a in arrays)
    if device == "fakecupy":
        # Only scalars come back to the host in a step: the loss's check for bad targets, its token count and
        # its sum. Packing is built from the host ids, so nothing comes back for it.
        assert set(host_sizes) == {1} and len(host_sizes) <= 3 * 2, host_sizes


@pytest.mark.parametrize("name", ["numpy", "fakecupy", "cupy"])
def test_a_fast_float32_step_stays_in_float32(name, request):
    """In-place work cannot promote: a float32 step with dropout leaves logits, their gradient, every weight,
    gradient and Adam moment in float32 (on CuPy this checks CuPy's own type promotion)."""
    if name == "cupy":
        request.getfixturevalue("cupy_gpu")
    _, model, opt, _, (logits, dlogits) = fast_training_step(name, steps=1, dropout=0.1)
    assert logits.dtype == dlogits.dtype == np.float32
    arrays = {f"{what} {n}": a for n, p in model.named_parameters()
              for what, a in (("weight", p.data), ("grad", p.grad))}
    arrays.update({f"adam {k} {i}": a for k, state in opt.state.items() for i, a in enumerate(state)})
    assert {k: a.dtype for k, a in arrays.items() if a.dtype != np.float32} == {}


def test_packed_attention_gradcheck_on_the_device(device, float64):
    """Packing's row index lives on the device (built from host ids, copied once); gradcheck moves the host
    rows there."""
    use(device)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 9, size=(2, 5))
    ids[0, 4:], ids[1, 2:] = 0, 0
    rows = Packing(ids, 0)
    x = rng.standard_normal((2, 5, 6))[ids != 0]              # (N,D) = (6,6)
    mask = padding_mask(mt.backend.asarray(ids), 0) & subsequent_mask(5)
    module = fast_twin(L.MultiHeadAttention(6, 3))
    report = mt.gradcheck.check(module, x, x.copy(), x.copy(), mask, (rows, rows), max_entries=12)
    report.assert_ok(1e-6)
    assert all(isinstance(p.grad, mt.backend.xp().ndarray) for p in module.parameters())


def test_packing_of_device_ids_equals_packing_of_host_ids(rng):
    use("numpy")
    ids = padded_ids(rng, [4, 1, 3], T=5)
    x = rng.standard_normal((3, 5, 4))
    host = Packing(ids, PAD)
    expected_rows, expected_grid = host.pack(x), host.unpack(host.pack(x))
    use("fakecupy")
    on_device = Packing(fakecupy.asarray(ids), PAD)           # counted on the device
    assert on_device.size == host.size and on_device.shape == host.shape
    packed = on_device.pack(fakecupy.asarray(x))
    np.testing.assert_array_equal(packed.get(), expected_rows)
    np.testing.assert_array_equal(on_device.unpack(packed).get(), expected_grid)
