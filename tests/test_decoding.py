"""Greedy decoding and beam search: the key/value cache emits exactly the tokens of the naive re-run,
beam size 1 is greedy, an exhaustive beam finds the best-scoring hypothesis, and the conventions
(no BOS, stop at EOS without it, default max_len, eval mode restored) hold.

The models are randomly initialised, in float64. A random Transformer tends to repeat one token for
ever, which would make "cached == naive" easy to pass; ``varied_model`` shifts the output bias so that
no token dominates on average (log-probabilities are centred per token over random inputs), which
makes decoded sequences varied and lets some of them end early at EOS.
"""

import itertools

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import decoding
from minitransformer.model import Transformer, TransformerConfig

PAD, BOS, EOS = 0, 1, 2


def config(vocab=13, **overrides):
    base = {"src_vocab_size": vocab, "tgt_vocab_size": vocab, "d_model": 16, "num_heads": 4,
            "num_encoder_layers": 2, "num_decoder_layers": 2, "d_ff": 24, "dropout": 0.1, "max_len": 64,
            "tie_output": False}
    return TransformerConfig(**{**base, **overrides})


def varied_model(seed=0, **overrides):
    mt.manual_seed(seed)
    model = Transformer(config(**overrides))
    rng = np.random.default_rng(seed)
    V = model.config.tgt_vocab_size
    src = rng.integers(3, V, size=(64, 9))
    tgt_in = rng.integers(3, V, size=(64, 9))
    tgt_in[:, 0] = BOS
    model.eval()
    model.projection.b.data -= model(src, tgt_in).mean(axis=(0, 1))   # centre every token's logit
    model.train()                                                      # decoding must switch to eval itself
    return model


SEEDS = (3, 4, 1, 5, 6)  # model seeds whose greedy outputs vary and sometimes end early (checked below)


def sources(rng=None, V=13):
    """Six sentences of different lengths, right-padded."""
    rng = np.random.default_rng(1234) if rng is None else rng
    lengths = [7, 4, 6, 2, 7, 1]
    src = np.full((6, 7), PAD)
    for row, n in enumerate(lengths):
        src[row, :n] = rng.integers(3, V, size=n)
    return src


@pytest.fixture
def model(float64):
    return varied_model(SEEDS[0])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_models_are_not_degenerate(float64, seed):
    """Otherwise the comparisons below would prove little."""
    out = decoding.greedy_decode(varied_model(seed), sources(), max_len=12)
    assert any(len(o) < 12 for o in out)                               # some sentences stop at EOS
    assert len({tuple(o) for o in out}) >= 3                           # different sentences, different outputs
    assert any(len(set(o)) > 1 for o in out)                           # not one token repeated


@pytest.mark.parametrize("seed", SEEDS)
def test_cached_greedy_equals_naive(float64, seed):
    model = varied_model(seed)
    src = sources()
    cached = decoding.greedy_decode(model, src, max_len=15)
    naive = decoding.greedy_decode(model, src, max_len=15, naive=True)
    assert cached == naive


@pytest.mark.parametrize("seed, beam_size, alpha", [(3, 3, 0.6), (4, 4, 0.0), (1, 5, 1.5)])
def test_cached_beam_search_equals_naive(float64, seed, beam_size, alpha):
    model = varied_model(seed)
    src = sources()
    cached = decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=15)
    naive = decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=15, naive=True)
    assert cached == naive


def test_cached_equals_naive_on_a_tied_pre_ln_model(float64, rng):
    """Plain random initialisation, shared and tied embeddings, pre-LN with its final LayerNorm."""
    mt.manual_seed(3)
    model = Transformer(config(tie_output=True, share_embeddings=True, norm_first=True))
    src = sources(rng)
    assert decoding.greedy_decode(model, src, max_len=10) == decoding.greedy_decode(model, src, max_len=10,
                                                                                    naive=True)
    assert decoding.beam_search(model, src, max_len=10) == decoding.beam_search(model, src, max_len=10, naive=True)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_beam_size_one_is_greedy(float64, seed):
    model = varied_model(seed)
    src = sources()
    greedy = decoding.greedy_decode(model, src, max_len=15)
    for alpha in (0.0, 0.6, 2.0):
        assert decoding.beam_search(model, src, beam_size=1, alpha=alpha, max_len=15) == greedy


# Scores whose maximum 2 ties at 9, 10, 11, 13, 14, 19, 22: argpartition alone returned 13.
TIED = np.array([1., 0, 0, 1, 1, 1, 1, 1, 0, 2, 2, 2, 0, 2, 2, 0, 1, 0, 0, 2, 0, 1, 2, 0])


def test_top_k_breaks_ties_by_index():
    assert decoding._top_k(TIED[None], 1).tolist() == [[9]]
    assert decoding._top_k(TIED[None], 9).tolist() == [[9, 10, 11, 13, 14, 19, 22, 0, 3]]
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(50, 40)).astype(np.float64)   # (b,n) ties everywhere
    scores[:10, ::3] = -np.inf                                      # as the never-generated tokens are
    straddling = 0
    for k in (1, 2, 5, 17, 39, 40):
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :k]   # (b,k) lowest index first on a tie
        assert decoding._top_k(scores, k).tolist() == expected.tolist(), k
        if k < 40:
            ranked = -np.sort(-scores, axis=1)                          # (b,n)
            straddling += int((ranked[:, k - 1] == ranked[:, k]).sum())  # a tie across the cut-off
    assert straddling > 100


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy_when_logits_tie(float64, alpha):
    model = varied_model(SEEDS[0], vocab=len(TIED))
    model.projection.W.data[...] = 0.0
    model.projection.b.data[...] = TIED                                 # the same tied logits at every step
    src = sources(V=len(TIED))
    greedy = decoding.greedy_decode(model, src, max_len=6)
    assert greedy == [[9] * 6] * len(src)                               # argmax: the first maximum
    assert decoding.beam_search(model, src, beam_size=1, alpha=alpha, max_len=6) == greedy


def test_decode_step_logits_equal_the_full_decoder(model, rng):
    """The cache path computes the same numbers as the full decoder, position by position."""
    model.eval()
    src = sources(rng)
    T = 6
    tgt_in = rng.integers(3, 13, size=(6, T))
    tgt_in[:, 0] = BOS
    memory = model.encode(src)
    src_mask = model.src_mask(src)
    full = model.decode(tgt_in, memory, src_mask)                      # (B,T,V)
    cache = decoding.KVCache(model, memory, src_mask)
    for t in range(T):
        step = decoding.decode_step(model, tgt_in[:, t:t + 1], cache)            # (B,V)
        np.testing.assert_allclose(step, full[:, t], rtol=0, atol=1e-12)
    assert cache.length == T and cache.self_k[0].shape == (6, 4, T, 4)


def test_memory_is_projected_once_per_decoder_layer(model, rng, monkeypatch):
    cross = [layer.cross_attn for layer in model.decoder.layers]
    calls = []
    original = decoding.project_kv

    def spy(attention, x):
        if any(attention is c for c in cross):                        # self-attention projects every step
            calls.append(attention)
        return original(attention, x)

    monkeypatch.setattr(decoding, "project_kv", spy)
    decoding.beam_search(model, sources(rng), beam_size=3, max_len=8)
    assert len(calls) == 2 and calls[0] is cross[0] and calls[1] is cross[1]
    calls.clear()
    decoding.greedy_decode(model, sources(rng), max_len=8)
    assert len(calls) == 2


def test_exhaustive_beam_finds_the_best_hypothesis(float64):
    """With a beam as wide as the whole search space, beam search must return argmax_Y log P(Y) / lp(|Y|).
    Vocabulary: pad, bos, eos and three symbols; max_len 3. There are 1 + 3 + 9 hypotheses that end in EOS
    and 27 that reach max_len, and never more than 40 candidates (alive or ended) at one step, so a
    beam of 40 prunes nothing."""
    model = varied_model(seed=4, vocab=6)
    src = np.array([[3, 4, 5], [5, 5, 0], [4, 0, 0]])
    alpha, L = 0.6, 3
    model.eval()
    memory, src_mask = model.encode(src), model.src_mask(src)
    best = []
    for b in range(3):
        scored = []
        for n in range(1, L + 1):
            for body in itertools.product([3, 4, 5], repeat=n - 1):
                for last in ([2, 3, 4, 5] if n == L else [2]):         # end with EOS, or anything at max_len
                    y = list(body) + [last]
                    tgt_in = np.array([[BOS] + y[:-1]])
                    logits = model.decode(tgt_in, memory[b:b + 1], src_mask[b:b + 1])[0]   # (n,V)
                    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
                    score = sum(logp[i, y[i]] for i in range(n)) / ((5 + n) / 6) ** alpha
                    scored.append((score, y[:-1] if y[-1] == EOS else y))
        scored.sort(key=lambda s: -s[0])
        assert scored[0][0] - scored[1][0] > 1e-9                       # a unique best
        best.append(scored[0][1])
    assert decoding.beam_search(model, src, beam_size=40, alpha=alpha, max_len=L) == best
    assert decoding.beam_search(model, src, beam_size=40, alpha=alpha, max_len=L, naive=True) == best


def test_output_conventions(model, rng):
    src = sources(rng)
    V = model.config.tgt_vocab_size
    model.projection.b.data[[PAD, BOS]] += 1e3                         # pad and BOS must still never appear
    for out in (decoding.greedy_decode(model, src, max_len=9), decoding.beam_search(model, src, max_len=9)):
        assert isinstance(out, list) and len(out) == 6
        for ids in out:
            assert all(isinstance(i, int) and 3 <= i < V for i in ids)  # no pad, BOS or EOS inside
            assert len(ids) <= 9


def test_max_len_is_source_length_plus_50_at_most(float64, rng):
    model = varied_model(max_len=40)
    model.projection.b.data[EOS] -= 1e3                                # EOS never wins: run to the limit
    src = sources(rng)
    lengths = (src != PAD).sum(1)
    assert [len(o) for o in decoding.greedy_decode(model, src)] == [min(n + 50, 40) for n in lengths]
    model = varied_model(max_len=512)
    model.projection.b.data[EOS] -= 1e3
    assert [len(o) for o in decoding.greedy_decode(model, src[:, :2])] == [52, 52, 52, 52, 52, 51]
    assert [len(o) for o in decoding.beam_search(model, src[:, :2], beam_size=2)] == [52, 52, 52, 52, 52, 51]
    # an explicit max_len may only lower the limit: the source length + 50 caps it, for every model
    assert [len(o) for o in decoding.greedy_decode(model, src, max_len=1000)] == [n + 50 for n in lengths]
    assert [len(o) for o in decoding.beam_search(model, src, beam_size=2, max_len=10**30)] == [n + 50 for n in lengths]
    assert [len(o) for o in decoding.greedy_decode(model, src, max_len=53)] == [min(n + 50, 53) for n in lengths]


def test_mode_is_restored(model, rng):
    src = sources(rng)
    model.train()
    decoding.greedy_decode(model, src, max_len=3)
    assert all(m.training for m in model.modules())
    decoding.beam_search(model, src, max_len=3)
    assert all(m.training for m in model.modules())
    model.eval()
    decoding.beam_search(model, src, max_len=3)
    assert not any(m.training for m in model.modules())


def test_decode_step_needs_eval_mode(model, rng):
    cache = decoding.KVCache(model.eval(), model.encode(sources(rng)), model.src_mask(sources(rng)))
    model.train()
    with pytest.raises(RuntimeError, match="model.eval"):
        decoding.decode_step(model, np.full((6, 1), BOS), cache)


def test_batching_and_padding_do_not_change_the_result(float64):
    """A sentence decodes to the same tokens alone (unpadded) as inside a padded batch."""
    model = varied_model(SEEDS[1])
    src = sources()
    batched_greedy = decoding.greedy_decode(model, src, max_len=12)
    batched_beam = decoding.beam_search(model, src, beam_size=3, max_len=12)
    for row in range(len(src)):
        alone = src[row:row + 1, :(src[row] != PAD).sum()]
        assert decoding.greedy_decode(model, alone, max_len=12) == [batched_greedy[row]]
        assert decoding.beam_search(model, alone, beam_size=3, max_len=12) == [batched_beam[row]]
