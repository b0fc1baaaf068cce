"""PyTorch parity of the whole model: the weights of a torch.nn.Transformer (plus embeddings scaled by
sqrt(d_model), the sinusoidal positional encoding and the output projection) are copied into ours;
the logits and the gradient of EVERY parameter, for a random dlogits, agree to 1e-8 in float64,
with padding in source and target and the causal mask. Skipped where torch is not installed.

Padding: both compute every position of the padded (B,T) grid, padded queries included (a padded key
gets zero weight in both). So the logits are compared at every position, and dlogits is random at every
position too, padded ones included: the gradients then carry what the padded rows send back, in both.
No sentence here is all padding (torch would give NaN for a query with every key masked, ours zero
weights; test_model.py checks ours against finite differences there).

Layout notes. Our Linear stores W as (in, out), torch's weight is (out, in): ours = torch.T.
torch's MultiheadAttention packs in_proj_weight = [W_q; W_k; W_v] as rows.
torch.nn.Transformer always builds a final LayerNorm for each stack. The paper's post-LN model has
none (each sublayer already ends in a LayerNorm), so for norm_first=False they are removed
(``encoder.norm = decoder.norm = None``); pre-LN needs them, and our norm_first model has them too.
"""

import math

import numpy as np
import pytest

from minitransformer.layers.positional import sinusoidal_table
from minitransformer.model import Transformer, TransformerConfig

torch = pytest.importorskip("torch")

TOL = 1e-8
PAD = 0
D, H, F, V, NUM_LAYERS = 16, 4, 24, 13, 2


def as_ours(t):
    return t.detach().numpy().copy()


def identity(t):
    return t


def transpose(t):
    return t.T


def pairs(ours, ref, src_emb, tgt_emb, out):
    """(our Parameter, torch Parameter, torch layout -> our layout) for every parameter of ours.
    The same function maps the weight (to copy it in) and its gradient (to compare)."""
    def linear(lin, weight, bias, rows=slice(None)):
        return [(lin.W, weight, lambda t: t[rows].T), (lin.b, bias, lambda t: t[rows])]

    def mha(our, theirs):
        result = []
        for i, lin in enumerate((our.W_q, our.W_k, our.W_v)):     # in_proj = [W_q; W_k; W_v] as rows
            result += linear(lin, theirs.in_proj_weight, theirs.in_proj_bias, slice(i * D, (i + 1) * D))
        return result + linear(our.W_o, theirs.out_proj.weight, theirs.out_proj.bias)

    def norm(our, theirs):
        return [(our.gamma, theirs.weight, identity), (our.beta, theirs.bias, identity)]

    def ffn(our, theirs):
        return (linear(our.W1, theirs.linear1.weight, theirs.linear1.bias)
                + linear(our.W2, theirs.linear2.weight, theirs.linear2.bias))

    result = [(ours.src_embed.weight, src_emb.weight, identity)]
    if ours.tgt_embed.weight is not ours.src_embed.weight:
        result.append((ours.tgt_embed.weight, tgt_emb.weight, identity))
    for our, theirs in zip(ours.encoder.layers, ref.encoder.layers):
        result += mha(our.self_attn, theirs.self_attn) + norm(our.sublayer_attn.norm, theirs.norm1)
        result += ffn(our.ffn, theirs) + norm(our.sublayer_ffn.norm, theirs.norm2)
    for our, theirs in zip(ours.decoder.layers, ref.decoder.layers):
        result += mha(our.self_attn, theirs.self_attn) + norm(our.sublayer_self.norm, theirs.norm1)
        result += mha(our.cross_attn, theirs.multihead_attn) + norm(our.sublayer_cross.norm, theirs.norm2)
        result += ffn(our.ffn, theirs) + norm(our.sublayer_ffn.norm, theirs.norm3)
    if ours.encoder.norm is not None:
        result += norm(ours.encoder.norm, ref.encoder.norm) + norm(ours.decoder.norm, ref.decoder.norm)
    if out is not None:
        result += [(ours.projection.W, out.weight, transpose), (ours.projection.b, out.bias, identity)]
    return result


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("share, norm_first", [(True, False), (False, True)])
def test_transformer_matches_torch(float64, rng, share, norm_first):
    torch.manual_seed(0)
    cfg = TransformerConfig(V, V, d_model=D, num_heads=H, num_encoder_layers=NUM_LAYERS,
                            num_decoder_layers=NUM_LAYERS, d_ff=F, dropout=0.0, max_len=20,
                            share_embeddings=share, tie_output=share, norm_first=norm_first)
    ours = Transformer(cfg)
    ref = torch.nn.Transformer(D, H, NUM_LAYERS, NUM_LAYERS, F, dropout=0.0, activation="relu",
                               batch_first=True, norm_first=norm_first, dtype=torch.float64)
    if not norm_first:
        ref.encoder.norm = None                                # the paper's post-LN stacks end in a sublayer's
        ref.decoder.norm = None                                # own LayerNorm: no extra one
    src_emb = torch.nn.Embedding(V, D, dtype=torch.float64)
    tgt_emb = src_emb if share else torch.nn.Embedding(V, D, dtype=torch.float64)
    out = None if share else torch.nn.Linear(D, V, dtype=torch.float64)
    modules = [ref, src_emb, tgt_emb] + ([] if out is None else [out])
    with torch.no_grad():                                      # no parameter at a trivial value (LN 1/0, bias 0)
        for module in modules:
            for p in module.parameters():
                p.add_(0.2 * torch.randn_like(p))

    mapping = pairs(ours, ref, src_emb, tgt_emb, out)
    assert sorted(id(p) for p, _, _ in mapping) == sorted(id(p) for p in ours.parameters())  # each once
    for p, theirs, to_ours in mapping:
        p.data[...] = as_ours(to_ours(theirs))

    src = rng.integers(3, V, size=(3, 7))
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    tgt_in = rng.integers(3, V, size=(3, 6))
    tgt_in[:, 0] = 1
    tgt_in[0, 4:] = PAD
    tgt_in[2, 3:] = PAD
    dlogits = rng.standard_normal((3, 6, V))                  # nonzero at padded positions as well

    # torch
    src_t, tgt_t = torch.tensor(src), torch.tensor(tgt_in)
    pe = torch.tensor(sinusoidal_table(20, D))
    x = src_emb(src_t) * math.sqrt(D) + pe[:7]
    y = tgt_emb(tgt_t) * math.sqrt(D) + pe[:6]
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)      # True = may NOT attend
    h = ref(x, y, tgt_mask=causal, src_key_padding_mask=src_t == PAD, tgt_key_padding_mask=tgt_t == PAD,
            memory_key_padding_mask=src_t == PAD)
    logits_t = h @ tgt_emb.weight.T if out is None else out(h)
    (logits_t * torch.tensor(dlogits)).sum().backward()

    # ours
    logits = ours(src, tgt_in)
    ours.backward(dlogits)

    assert ref.training                    # torch's inference fast path would write zeros at padded positions
    np.testing.assert_allclose(logits, as_ours(logits_t), rtol=0, atol=TOL)   # every position, padded ones too
    names = {id(p): n for n, p in ours.named_parameters()}
    for p, theirs, to_ours in mapping:
        np.testing.assert_allclose(p.grad, as_ours(to_ours(theirs.grad)), rtol=0, atol=TOL, err_msg=names[id(p)])
        if not names[id(p)].endswith("W_k.b"):                 # the key bias adds the same to a whole score row,
            assert np.abs(p.grad).max() > 1e-6, names[id(p)]   # which softmax ignores: its gradient is exactly 0
