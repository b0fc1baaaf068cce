"""From a trained model to output sentences: greedy decoding and beam search, batched over sentences,
with a key/value cache so that each new token runs the decoder for one position only.

Why a cache. The decoder is causal, so the keys and values of position t never change once computed:
re-running the whole prefix at every step (``naive=True``) recomputes them all, O(T^2) positions for a
sentence of T tokens. The incremental decoder keeps, for every decoder layer,
    self-attention:  the keys and values of the prefix, (B,H,t,Dk) and (B,H,t,Dv), one row appended per step;
    cross-attention: the encoder memory projected to keys and values ONCE per sentence, (B,H,S,Dk), (B,H,S,Dv).
Both paths do the same arithmetic and emit the same tokens (the tests check it, token for token).

Output convention (both functions): one list of token ids per sentence, without BOS, stopping at EOS,
which is NOT included; a sentence that reaches max_len without EOS gives max_len tokens. The padding
and BOS ids are never generated (their scores are -inf): the target side never sees them mid-sentence.
``max_len`` (the most tokens generated per sentence) defaults to that sentence's source length + 50,
which is also its cap, as is ``config.max_len`` (the positional-encoding table's length): the work of a
sentence is bounded by its source for every model. Before any work, ``budget.check_decoding`` refuses a
decoding whose memory (attention scores of each head, key/value cache, beam x vocabulary scores) passes the
memory budget.

Both functions run the model in eval mode (dropout off) and restore its previous mode afterwards.
"""

from __future__ import annotations

import contextlib

import numpy

from . import backend, budget, checks
from .model import Transformer

EXTRA_LENGTH = 50  # default max_len = source length + 50 (§6.1)
MAX_BEAM = 100     # the paper's beams are 4 to 21 wide; a wider one is a typo, refused before any work


class KVCache:
    """The keys and values the incremental decoder has computed so far, per decoder layer i.

    self_k[i], self_v[i]   (B,H,t,Dk|Dv)  the prefix's self-attention keys/values, one row more per ``decode_step``
    cross_k[i], cross_v[i] (B,H,S,Dk|Dv)  the encoder memory projected by layer i's cross-attention, once
    src_mask               (B,1,1,S)   which memory positions are real tokens
    length                 t, the number of target positions decoded so far (the next position's index)
    ``select(rows)`` keeps batch rows in the given order: beam search reorders its beams with it, and
    finished sentences leave the batch with it.
    """

    def __init__(self, model, memory, src_mask):             # memory (B,S,D), src_mask (B,1,1,S)
        layers = list(model.decoder.layers)
        self.cross_k, self.cross_v = [], []
        for layer in layers:
            k, v = project_kv(layer.cross_attn, memory)        # (B,H,S,Dk), (B,H,S,Dv), once per sentence
            self.cross_k.append(k)
            self.cross_v.append(v)
        self.self_k = [None] * len(layers)                     # (B,H,t,Dk|Dv) once the first step ran
        self.self_v = [None] * len(layers)
        self.src_mask = src_mask
        self.length = 0

    def select(self, rows) -> None:
        """Keep batch rows ``rows`` (host ints), in that order; a row may appear several times."""
        rows = backend.asarray(numpy.asarray(rows, dtype=numpy.int64))
        for arrays in (self.self_k, self.self_v, self.cross_k, self.cross_v):
            for i, a in enumerate(arrays):
                if a is not None:
                    arrays[i] = a[rows]                        # (b,H,...,Dk|Dv) gathered copy
        self.src_mask = self.src_mask[rows]                    # (b,1,1,S)


def project_kv(attention, x):
    """The keys and values a MultiHeadAttention computes from x, split into heads.
                                                           Shapes: x (B,T,D) -> k (B,H,T,Dk), v (B,H,T,Dv)"""
    return attention.split_heads(attention.W_k.forward(x)), attention.split_heads(attention.W_v.forward(x))


def attend(attention, query, k, v, mask=None):
    """MultiHeadAttention's forward with keys and values already projected (by ``project_kv``).
                    Shapes: query (B,Tq,D), k (B,H,Tk,Dk), v (B,H,Tk,Dv), mask (B|1,1,Tq|1,Tk) -> (B,Tq,D)"""
    q = attention.split_heads(attention.W_q.forward(query))     # (B,H,Tq,Dk)
    heads = attention.attention.forward(q, k, v, mask)          # (B,H,Tq,Dv)
    return attention.W_o.forward(attention.merge_heads(heads))  # (B,Tq,D)


def decode_step(model, last_ids, cache):
    """logits for the next token, running the decoder for the newest position only (eval mode).
                                                         Shapes: last_ids (B,1) int -> logits (B,V)
    Each decoder layer does what its forward does, for one position: the self-attention appends the new
    position's key and value to the cache and attends over the whole prefix (no causal mask is needed:
    the prefix is all there is); the cross-attention reads the memory projected once."""
    xp = backend.xp()
    model.check_eval("decode_step")
    y = model.tgt_pos.forward(model.tgt_embed.forward(last_ids), offset=cache.length)  # (B,1,D), no dropout in eval
    for i, layer in enumerate(model.decoder.layers):
        def self_attention(h, i=i, attention=layer.self_attn):  # h (B,1,D)
            k, v = project_kv(attention, h)                     # (B,H,1,Dk), (B,H,1,Dv)
            cache.self_k[i] = k if cache.self_k[i] is None else xp.concatenate([cache.self_k[i], k], axis=2)
            cache.self_v[i] = v if cache.self_v[i] is None else xp.concatenate([cache.self_v[i], v], axis=2)
            return attend(attention, h, cache.self_k[i], cache.self_v[i])   # (B,1,D)

        def cross_attention(h, i=i, attention=layer.cross_attn):
            return attend(attention, h, cache.cross_k[i], cache.cross_v[i], cache.src_mask)  # (B,1,D)

        y = layer.sublayer_self.forward(y, self_attention)      # (B,1,D)
        y = layer.sublayer_cross.forward(y, cross_attention)    # (B,1,D)
        y = layer.sublayer_ffn.forward(y, layer.ffn.forward)    # (B,1,D)
    if model.decoder.norm is not None:
        y = model.decoder.norm.forward(y)
    cache.length += 1
    return model.projection.forward(y)[:, -1]                  # (B,V)


class _NextToken:
    """Log-probabilities of the next token for a batch of prefixes: cached (one new position per call)
    or naive (the whole prefix again). Both sides of the comparison share everything else."""

    def __init__(self, model, src, naive: bool):              # src (B,S) ids, host or device
        self.model, self.naive = model, naive
        self.src_mask = model.src_mask(src)                    # (B,1,1,S)
        self.memory = model.encode(src)                        # (B,S,D), the source encoded once
        self.cache = None if naive else KVCache(model, self.memory, self.src_mask)

    def log_probs(self, prefix):                               # prefix (b,t) host ints -> (b,V) host float64
        xp = backend.xp()
        if self.naive:
            logits = self.model.decode(prefix, self.memory, self.src_mask)[:, -1]   # (b,V)
        else:
            logits = decode_step(self.model, backend.asarray(prefix[:, -1:]), self.cache)  # (b,V)
        z = logits.astype(xp.float64) - logits.max(axis=-1, keepdims=True)          # (b,V)
        logp = z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))                     # log softmax (b,V)
        c = self.model.config
        logp[:, [c.pad_id, c.bos_id]] = -numpy.inf             # never generated
        return backend.to_numpy(logp)

    def select(self, rows) -> None:
        if self.naive:
            rows = backend.asarray(numpy.asarray(rows, dtype=numpy.int64))
            self.memory, self.src_mask = self.memory[rows], self.src_mask[rows]   # (b,S,D), (b,1,1,S)
        else:
            self.cache.select(rows)


def length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^alpha  (Wu et al., 2016), the paper's length penalty (§6.1, alpha = 0.6)."""
    return ((5.0 + numpy.asarray(length, dtype=numpy.float64)) / 6.0) ** alpha


def _prepare(owner, model, src, max_len, beam_size=1, naive=False):
    """Check the arguments, and the memory the decoding will take (``budget``); the checked source ids (NumPy
    for host data: the model moves them), and each sentence's length limit (host ints)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"{owner}: model must be a minitransformer Transformer, got {type(model).__name__}")
    c = model.config
    src = checks.token_ids(owner, "src", src, c.src_vocab_size, ndim=2, max_len=c.max_len)   # (B,S)
    cap = c.max_len if max_len is None else min(checks.positive_int(owner, "max_len", max_len), c.max_len)
    src_lengths = backend.to_numpy((src != c.pad_id).sum(axis=1))          # (B,) real tokens per sentence
    limits = numpy.minimum(src_lengths + EXTRA_LENGTH, cap)                 # (B,)
    budget.check_decoding(owner, model, src.shape[0], src.shape[1], int(limits.max()), beam_size, naive)
    return src, limits.astype(numpy.int64)


@contextlib.contextmanager
def eval_mode(model):
    """model.eval() inside the block, then the mode it had: decoding in the middle of training (a validation
    BLEU) must not leave dropout switched off."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _top_k(scores, k: int):
    """Column indices of the k largest scores of each row, best first; equal scores in index order, also
    at the cut-off (so beam size 1 picks greedy's first maximum).   Shapes: scores (b,n) -> (b,k) ints
    argpartition finds the k best in O(n) (a stable sort of the K*V candidates is ~5x slower, and would
    dominate the search); only those k are then sorted. When a score equal to the k-th best was left out,
    argpartition may have kept a later index instead of it: those rows (rare) get the stable sort."""
    part = numpy.argpartition(-scores, k - 1, axis=1)[:, :k]          # (b,k) the k best, in no order
    best = numpy.take_along_axis(scores, part, axis=1)                # (b,k)
    kth = best.min(axis=1, keepdims=True)                             # (b,1) the k-th best score
    tied = (scores == kth).sum(axis=1) > (best == kth).sum(axis=1)    # (b,) some score equal to it left out
    part[tied] = numpy.argsort(-scores[tied], axis=1, kind="stable")[:, :k]  # the lowest indices of the tie
    part = numpy.sort(part, axis=1)                                   # (b,k) by index, so that a tie ...
    order = numpy.argsort(-numpy.take_along_axis(scores, part, axis=1), axis=1, kind="stable")  # ... keeps it
    return numpy.take_along_axis(part, order, axis=1)                 # (b,k)


def _strip(ids) -> list:
    """A hypothesis as a list of Python ints."""
    return [int(i) for i in ids]


def greedy_decode(model, src, max_len=None, naive: bool = False) -> list:
    """At every step, feed back the single most probable token.

    model    a Transformer
    src      (B,S) int token ids (NumPy or the active backend), padded with config.pad_id
    max_len  the most tokens generated per sentence (default and cap: its source length + 50; at most config.max_len)
    naive    re-run the decoder on the whole prefix at every step instead of using the key/value cache
    Returns a list of B lists of token ids (no BOS, stopped at EOS, EOS excluded).
    """
    owner = "greedy_decode"
    src, limits = _prepare(owner, model, src, max_len, 1, naive)
    c = model.config
    with eval_mode(model):
        step = _NextToken(model, src, naive)
        B = src.shape[0]
        outputs = [[] for _ in range(B)]
        rows = numpy.arange(B)                                 # the sentence each batch row belongs to (b,)
        prefix = numpy.full((B, 1), c.bos_id, dtype=numpy.int64)   # (b,t): BOS, then what was generated
        for t in range(int(limits.max())):
            next_ids = step.log_probs(prefix).argmax(axis=-1)  # (b,) the first maximum on a tie
            going_on = next_ids != c.eos_id                    # (b,)
            for r in numpy.flatnonzero(going_on):
                outputs[rows[r]].append(int(next_ids[r]))
            going_on &= t + 1 < limits[rows]                   # the sentence has room for another token
            if not going_on.any():
                break
            keep = numpy.flatnonzero(going_on)                 # finished sentences leave the batch
            if len(keep) < len(rows):
                step.select(keep)
            rows = rows[keep]
            prefix = numpy.concatenate([prefix[keep], next_ids[keep, None]], axis=1)   # (b,t+1)
        return outputs


def beam_search(model, src, beam_size: int = 4, alpha: float = 0.6, max_len=None, naive: bool = False,
                steps=None) -> list:
    """Keep the beam_size best hypotheses per sentence at every step (§6.1: beam 4, alpha 0.6).

    A hypothesis Y is scored s(Y) = log P(Y | src) / lp(|Y|), with lp the length penalty above and |Y| its
    number of tokens, EOS included. Every step, each of the K live hypotheses proposes every next token;
    the K best candidates by s survive (a finished hypothesis competes with its fixed score and stays as it
    is). A sentence is done when all K hypotheses have ended, by EOS or at max_len; the answer is the one
    with the best final s. With beam_size=1 this is greedy decoding.

    model, src, max_len, naive   as in ``greedy_decode``
    beam_size                    K, an int in [1, MAX_BEAM]
    alpha                        the length penalty's exponent, >= 0 (0: plain log-probability)
    steps                        a list, or None: each step appends (sentences, hypotheses (b,K,t), their
                                 scores s (b,K), best first), to show the search (an ended one repeats EOS)
    Returns a list of B lists of token ids (no BOS, stopped at EOS, EOS excluded).
    """
    owner = "beam_search"
    checks.int_in(owner, "beam_size", beam_size, 1, MAX_BEAM)
    if steps is not None and not isinstance(steps, list):
        raise TypeError(f"{owner}: steps must be a list (to collect each step in) or None, got {type(steps).__name__}")
    checks.non_negative(owner, "alpha", alpha)
    src, limits = _prepare(owner, model, src, max_len, beam_size, naive)
    c = model.config
    K, eos = int(beam_size), c.eos_id
    with eval_mode(model):
        step = _NextToken(model, src, naive)                   # memory projected once per sentence ...
        B = src.shape[0]
        step.select(numpy.repeat(numpy.arange(B), K))          # ... then copied to its K beams: rows (B*K)
        outputs = [None] * B
        rows = numpy.arange(B)                                 # the sentence of each row of the arrays below
        log_p = numpy.full((B, K), -numpy.inf)                 # log P(Y) of each hypothesis (b,K)
        log_p[:, 0] = 0.0                                      # one empty hypothesis to start from
        final = numpy.full((B, K), -numpy.inf)                 # s(Y) once the hypothesis ended (b,K)
        ended = numpy.zeros((B, K), dtype=bool)                # (b,K)
        lengths = numpy.zeros((B, K), dtype=numpy.int64)       # |Y|, EOS included (b,K)
        tokens = numpy.zeros((B, K, 0), dtype=numpy.int64)     # the hypotheses (b,K,t)
        for t in range(int(limits.max())):
            b = len(rows)
            prefix = numpy.concatenate([numpy.full((b, K, 1), c.bos_id), tokens], axis=2).reshape(b * K, t + 1)
            step_logp = step.log_probs(prefix).reshape(b, K, -1)  # (b,K,V)
            V = step_logp.shape[-1]
            # Candidate scores s = log P(Y + token) / lp(t + 1). An ended hypothesis has one candidate:
            # itself, with its final score, written at the EOS slot (and fed EOS, which nobody reads).
            cand = (log_p[:, :, None] + step_logp) / length_penalty(t + 1, alpha)  # (b,K,V)
            cand[ended] = -numpy.inf
            cand[ended, eos] = final[ended]
            flat = cand.reshape(b, K * V)                      # (b,K*V)
            best = _top_k(flat, K)                             # (b,K) best first
            score = numpy.take_along_axis(flat, best, axis=1)  # (b,K)
            beam, token = best // V, best % V                  # which hypothesis, which next token (b,K)
            i = numpy.arange(b)[:, None]                       # (b,1)
            was_ended = ended[i, beam]                         # (b,K)
            log_p = log_p[i, beam] + step_logp[i, beam, token]  # (b,K)
            ended = was_ended | (token == eos) | ~numpy.isfinite(score)  # -inf: no candidate was left
            final = numpy.where(was_ended, final[i, beam], numpy.where(ended, score, -numpy.inf))   # (b,K)
            lengths = numpy.where(was_ended, lengths[i, beam], t + 1)           # (b,K)
            tokens = numpy.concatenate([tokens[i, beam], token[:, :, None]], axis=2)  # (b,K,t+1)
            if steps is not None:
                steps.append((rows, tokens, score))
            # Hypotheses still going when their sentence reaches max_len end here, without EOS.
            at_limit = (t + 1 >= limits[rows])[:, None] & ~ended  # (b,K)
            final = numpy.where(at_limit, score, final)
            ended |= at_limit
            done = ended.all(axis=1)                           # (b,)
            for j in numpy.flatnonzero(done):
                k = int(numpy.argmax(final[j]))                # the first best on a tie
                n = int(lengths[j, k])
                ids = tokens[j, k, :n]
                outputs[rows[j]] = _strip(ids[:-1] if n and ids[-1] == eos else ids)
            if done.all():
                break
            keep = numpy.flatnonzero(~done)                    # (b',) sentences still searching
            step.select((keep[:, None] * K + beam[keep]).reshape(-1))  # reorder beams, drop done sentences
            rows, log_p, final, ended = rows[keep], log_p[keep], final[keep], ended[keep]
            lengths, tokens = lengths[keep], tokens[keep]
        return outputs


__all__ = ["KVCache", "attend", "beam_search", "decode_step", "eval_mode", "greedy_decode", "length_penalty",
           "project_kv"]
