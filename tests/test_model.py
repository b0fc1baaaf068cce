"""The whole model: configuration, a finite-difference check of every parameter, causality, padding,
weight tying and gradient accumulation. (Its input refusals are in test_input_validation.py.)

Gradient bound: relative error < 1e-6 for every parameter tensor (mt.gradcheck.DEFAULT_TOLERANCE), in
float64. The checks sample at most MAX_ENTRIES (or the stated max_entries) entries per tensor to stay
fast, chosen at random by gradcheck; every parameter tensor and every float input is still checked.
"""

import json

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.model import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    Transformer,
    TransformerConfig,
)

BOUND = 1e-6
MAX_ENTRIES = 12
PAD = 0


def tiny_config(**overrides):
    """The test size: d_model 12, 3 heads, 2+2 layers, d_ff 10, one vocabulary of 11, tied."""
    base = {"src_vocab_size": 11, "tgt_vocab_size": 11, "d_model": 12, "num_heads": 3, "num_encoder_layers": 2,
            "num_decoder_layers": 2, "d_ff": 10, "dropout": 0.0, "max_len": 32, "share_embeddings": True,
            "tie_output": True}
    return TransformerConfig(**{**base, **overrides})


def batch():
    """B=2, S=5, T=4, with padding in the source and in the target, and repeated tokens."""
    src = np.array([[3, 4, 5, 4, 6],
                    [7, 8, 9, 0, 0]])
    tgt_in = np.array([[1, 3, 3, 5],
                       [1, 7, 0, 0]])
    return src, tgt_in


def randomize(model, rng, scale=0.3):
    """Move LayerNorm gains and every bias away from 1 and 0, so no gradient hides behind a trivial value."""
    for name, p in model.named_parameters():
        if p.data.ndim == 1:
            p.data += scale * rng.standard_normal(p.data.shape)


def check_all(model, *inputs, **kw):
    report = mt.gradcheck.check(model, *inputs, **kw)
    report.assert_ok(BOUND)
    checked = {r.name for r in report.rows}
    assert {name for name, _ in model.named_parameters()} <= checked   # every parameter tensor
    return report


# ------------------------------------------------------------------------------------------- config

def test_presets():
    tiny = TransformerConfig.preset("tiny", src_vocab_size=14, tgt_vocab_size=14)
    assert tiny.num_encoder_layers == tiny.num_decoder_layers == 2 and tiny.d_model % tiny.num_heads == 0
    small = TransformerConfig.preset("small", src_vocab_size=100, tgt_vocab_size=120)
    assert (small.d_model, small.num_heads, small.num_encoder_layers, small.num_decoder_layers, small.d_ff,
            small.dropout) == (256, 8, 3, 3, 1024, 0.1)
    base = TransformerConfig.preset("base", src_vocab_size=100, tgt_vocab_size=100, dropout=0.2)
    assert (base.d_model, base.num_heads, base.num_encoder_layers, base.d_ff, base.dropout) == (512, 8, 6, 2048, 0.2)


def test_config_dict_round_trip():
    cfg = tiny_config(norm_first=True, dropout=0.25)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert TransformerConfig.from_dict(data) == cfg


# ------------------------------------------------------------------------------- gradient checks

def test_whole_model_gradcheck(float64, rng):
    """Tied and shared embeddings, padding in source and target, dropout 0, 2+2 layers."""
    model = Transformer(tiny_config())
    randomize(model, rng)
    assert model.tgt_embed.weight is model.src_embed.weight is model.projection.weight
    check_all(model, *batch(), max_entries=MAX_ENTRIES)


@pytest.mark.parametrize("padded", ["src", "tgt_in"])
def test_whole_model_gradcheck_with_a_batch_of_padding_only(float64, rng, padded):
    """A batch whose source (or target) is all padding: every key of a sentence is masked, and those rows
    get zero attention weights, not a uniform average over padding. The gradients must still match finite
    differences at every position (the encoder's are zero when there is no source: cross-attention masks
    every key)."""
    model = Transformer(tiny_config())
    randomize(model, rng)
    src, tgt_in = batch()
    inputs = (np.zeros_like(src), tgt_in) if padded == "src" else (src, np.zeros_like(tgt_in))
    check_all(model, *inputs, max_entries=MAX_ENTRIES)


def test_whole_model_gradcheck_with_dropout_in_training_mode(float64, rng):
    """gradcheck draws the same dropout masks at every forward (it restores the seeded generator)."""
    model = Transformer(tiny_config(dropout=0.3))
    randomize(model, rng)
    assert model.training
    check_all(model, *batch(), max_entries=6)


def test_whole_model_gradcheck_pre_ln_untied(float64, rng):
    """norm_first (with the final LayerNorms), separate vocabularies, an untied projection with a bias."""
    model = Transformer(tiny_config(norm_first=True, share_embeddings=False, tie_output=False,
                                    tgt_vocab_size=9))
    randomize(model, rng)
    src, tgt_in = batch()
    check_all(model, src, np.minimum(tgt_in, 8), max_entries=6)


@pytest.mark.parametrize("d_v", [None, 2])
def test_whole_model_gradcheck_learned_positions_and_head_size(float64, rng, d_v):
    """positional="learned" (a table P per side, each with its gradient), d_k != d_model / num_heads, and a
    value size d_v != d_k."""
    model = Transformer(tiny_config(positional="learned", d_k=5, d_v=d_v))
    randomize(model, rng)
    H = model.config.num_heads
    for attention in (model.encoder.layers[0].self_attn, model.decoder.layers[0].cross_attn):
        assert attention.W_q.W.shape == attention.W_k.W.shape == (12, H * 5)  # D -> H*Dk
        assert attention.W_v.W.shape == (12, H * (d_v or 5))                  # D -> H*Dv
        assert attention.W_o.W.shape == (H * (d_v or 5), 12)                  # H*Dv -> D
    check_all(model, *batch(), max_entries=4)


def layer_inputs(rng, B=2, T=4, S=5, D=12):
    y = rng.standard_normal((B, T, D))
    memory = rng.standard_normal((B, S, D))
    src, tgt_in = batch()
    src_mask = mt.masks.padding_mask(src, PAD)                                         # (B,1,1,S)
    tgt_mask = mt.masks.padding_mask(tgt_in, PAD) & mt.masks.subsequent_mask(T)        # (B,1,T,T)
    return y, memory, tgt_mask, src_mask


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_layers_gradcheck_inputs_too(float64, rng, norm_first):
    y, memory, tgt_mask, src_mask = layer_inputs(rng)
    check_all(EncoderLayer(12, 3, 10, norm_first=norm_first), memory, src_mask, max_entries=40)
    check_all(DecoderLayer(12, 3, 10, norm_first=norm_first), y, memory, tgt_mask, src_mask, max_entries=40)
    check_all(Encoder(2, 12, 3, 10, norm_first=norm_first), memory, src_mask, max_entries=8)


def test_decoder_memory_gradient_is_the_sum_over_layers(float64, rng):
    """Decoder.backward -> (dy, dmemory): memory feeds all three layers' cross-attention; the finite
    difference on memory sees every use, so the check fails if one layer's share is dropped."""
    y, memory, tgt_mask, src_mask = layer_inputs(rng)
    decoder = Decoder(3, 12, 3, 10)
    report = check_all(decoder, y, memory, tgt_mask, src_mask, max_entries=12)
    assert {"input[0]", "input[1]"} <= {r.name for r in report.rows}
    # And explicitly: dmemory equals the sum of each layer's cross-attention dkey + dvalue.
    decoder(y, memory, tgt_mask, src_mask)
    shares = []
    for layer in decoder.layers:
        original = layer.cross_attn.backward

        def spy(dout, original=original):
            dquery, dkey, dvalue = original(dout)
            shares.append(dkey + dvalue)
            return dquery, dkey, dvalue
        layer.cross_attn.backward = spy                                # on the instance: the class stays as it is
    _, dmemory = decoder.backward(rng.standard_normal(y.shape))
    assert len(shares) == 3
    np.testing.assert_allclose(dmemory, sum(shares), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------ masks and causality

def test_decoder_is_causal(float64, rng):
    model = Transformer(tiny_config()).eval()
    randomize(model, rng)
    src = rng.integers(3, 11, size=(3, 6))
    tgt_in = rng.integers(3, 11, size=(3, 7))
    tgt_in[:, 0] = 1
    logits = model(src, tgt_in)
    for t in range(1, 7):
        changed = tgt_in.copy()
        changed[:, t] = 3 + (changed[:, t] - 3 + 1) % 8                 # another real token
        new = model(src, changed)
        np.testing.assert_allclose(new[:, :t], logits[:, :t], rtol=0, atol=1e-12)
        assert np.abs(new[:, t:] - logits[:, t:]).max() > 1e-6        # the change does reach position t on


def test_padded_source_positions_change_nothing(float64, rng):
    model = Transformer(tiny_config()).eval()
    randomize(model, rng)
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    # More padding columns: the real tokens keep their positions, the new keys are masked.
    wider = np.concatenate([src, np.zeros((2, 3), dtype=src.dtype)], axis=1)
    np.testing.assert_allclose(model(wider, tgt_in), logits, rtol=0, atol=1e-12)
    # The encoder output at padded positions is never read by the cross-attention.
    memory = model.encode(src)
    src_mask = model.src_mask(src)
    np.testing.assert_allclose(model.decode(tgt_in, memory, src_mask), logits, rtol=0, atol=1e-12)
    memory[1, 3:] += 100.0 * rng.standard_normal((2, 12))             # sentence 1 is padded from position 3
    np.testing.assert_allclose(model.decode(tgt_in, memory, src_mask), logits, rtol=0, atol=1e-12)
    memory[1, 2] += 1.0                                                # a real position does matter
    assert np.abs(model.decode(tgt_in, memory, src_mask)[1] - logits[1]).max() > 1e-6


def test_attention_maps_have_the_documented_shapes(float64):
    model = Transformer(tiny_config())
    src, tgt_in = batch()
    model(src, tgt_in)
    maps = model.attention_maps()
    assert [m.shape for m in maps["encoder"]] == [(2, 3, 5, 5)] * 2
    assert [m.shape for m in maps["decoder_self"]] == [(2, 3, 4, 4)] * 2
    assert [m.shape for m in maps["decoder_cross"]] == [(2, 3, 4, 5)] * 2
    cross = maps["decoder_cross"][0]
    assert np.all(cross[1, :, :, 3:] == 0)                             # padded keys get exactly zero weight
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.triu(maps["decoder_self"][1][0], k=1) == 0)       # nothing from the future


# -------------------------------------------------------------------------------------------- tying

def test_tied_parameter_is_listed_once_and_named_once(float64):
    tied = Transformer(tiny_config())
    untied = Transformer(tiny_config(share_embeddings=False, tie_output=False))
    names = [n for n, _ in tied.named_parameters()]
    assert "src_embed.weight" in names and "tgt_embed.weight" not in names and "projection.weight" not in names
    assert len({id(p) for p in tied.parameters()}) == len(tied.parameters())
    # The untied model has two more tensors: the target embedding and the projection (W and b).
    assert len(untied.parameters()) == len(tied.parameters()) + 3
    assert list(tied.state_dict()) == names


def test_tied_gradient_is_the_sum_of_all_uses(float64, rng):
    """grad(E) of the tied model == grad(E_src) + grad(E_tgt) + grad(W_out)^T of an untied copy."""
    tied = Transformer(tiny_config())
    randomize(tied, rng)
    untied = Transformer(tiny_config(share_embeddings=False, tie_output=False))
    state = tied.state_dict()
    E = state["src_embed.weight"]
    untied.load_state_dict({**state, "tgt_embed.weight": E, "projection.W": E.T.copy(),
                            "projection.b": np.zeros(11)})
    src, tgt_in = batch()
    dlogits = rng.standard_normal((2, 4, 11))
    np.testing.assert_allclose(untied(src, tgt_in), tied(src, tgt_in), rtol=0, atol=1e-12)
    tied.backward(dlogits)
    untied.backward(dlogits)
    expected = untied.src_embed.weight.grad + untied.tgt_embed.weight.grad + untied.projection.W.grad.T
    np.testing.assert_allclose(tied.src_embed.weight.grad, expected, rtol=0, atol=1e-12)
    for part in (untied.src_embed.weight.grad, untied.tgt_embed.weight.grad, untied.projection.W.grad.T):
        assert np.abs(part).max() > 1e-6                               # each use contributes
    untied_grads = dict(untied.named_parameters())
    for name, p in tied.named_parameters():                            # every other gradient is the same
        if name != "src_embed.weight":
            np.testing.assert_allclose(p.grad, untied_grads[name].grad, rtol=0, atol=1e-12, err_msg=name)


def test_gradients_accumulate_without_zero_grad(float64, rng):
    model = Transformer(tiny_config())
    randomize(model, rng)
    src, tgt_in = batch()
    dlogits = rng.standard_normal((2, 4, 11))
    model(src, tgt_in)
    model.backward(dlogits)
    once = {n: p.grad.copy() for n, p in model.named_parameters()}
    model(src, tgt_in)
    model.backward(dlogits)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * once[name], rtol=1e-12, atol=1e-14, err_msg=name)
    model.zero_grad()
    assert all(np.all(p.grad == 0) for p in model.parameters())


def test_layers_inside_the_model_are_not_checked_again(monkeypatch):
    """The model checks its token ids once; its layers then call each other's forward, not layer(x), so
    no check_inputs runs per layer per step."""
    calls = []
    monkeypatch.setattr(mt.Module, "__call__", lambda self, *a, **k: calls.append(type(self).__name__) or
                        self.forward(*a, **k))
    model = Transformer(tiny_config())
    model(*batch())
    assert calls == ["Transformer"]


def test_state_dict_round_trip_gives_identical_logits(float64, rng):
    a = Transformer(tiny_config()).eval()
    randomize(a, rng)
    mt.manual_seed(5)
    b = Transformer(tiny_config()).eval()
    src, tgt_in = batch()
    assert np.abs(a(src, tgt_in) - b(src, tgt_in)).max() > 1e-3
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a(src, tgt_in), b(src, tgt_in))


def test_float32_by_default():
    model = Transformer(tiny_config())
    assert model(*batch()).dtype == np.float32


# -------------------------------------------------------------------------------------------- inputs

def test_lists_of_ids_are_accepted(float64):
    model = Transformer(tiny_config()).eval()
    src, tgt_in = batch()
    np.testing.assert_array_equal(model(src.tolist(), tgt_in.tolist()), model(src, tgt_in))


def test_inference_methods_refuse_training_mode():
    """encode and decode (as decode_step, test_decoding.py) have no backward: in training mode they would
    leave every layer waiting for one, and the next training step would fail naming a layer the user never
    called."""
    model = Transformer(tiny_config())                          # training mode, as built
    src, tgt_in = batch()
    memory = model.eval().encode(src)
    model.train()
    for method, call in [("encode", lambda: model.encode(src)),
                         ("decode", lambda: model.decode(tgt_in, memory, model.src_mask(src)))]:
        with pytest.raises(RuntimeError, match=rf"Transformer.{method} is for inference: call model.eval\(\) first"):
            call()
    model.backward(np.ones_like(model(src, tgt_in)))            # a training step still runs
