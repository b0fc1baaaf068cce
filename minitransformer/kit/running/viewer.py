"""The viewer's data: one sentence through any model of this package (core or fast tier), packed for a page that
runs offline (viewer.js and viewer.css inlined); ``viz.explain`` wraps it in an ``Explanation``.

For (src, tgt), tgt the model's own output unless given: every attention map A (H,Tq,Tk) of the three stacks, the
queries and keys it came from, its mask; after one backward pass of the loss (cross-entropy, no label smoothing),
dL/dA and each head's share of the gradient reaching the embeddings; the decoding step by step (greedy, or each
step's beam) with the next-token probabilities and the cross-attention; the positional encodings. Arrays travel as
base64 float32 (exact, and under half the size of the numbers written out). Past MAX_TOKENS tokens a side the input
is cut, with a note: the views draw T x T maps.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy

from minitransformer import backend, checks, decoding, fast
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer

MAX_TOKENS = 50                  # per side; a longer source or output is cut, with a note on the page
TOP_K = 5                        # next-token candidates shown at each decoding step
STACKS = ("encoder", "decoder_self", "decoder_cross")


def _pack(x) -> dict:
    a = numpy.ascontiguousarray(backend.to_numpy(x), dtype="<f4")
    return {"shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _ids(owner: str, name: str, value, tokenizer, vocab_size: int) -> list:
    """A sentence as a list of token ids: a text (read by the tokenizer) or a sequence of ints."""
    if isinstance(value, str):
        if tokenizer is None:
            raise ValueError(f"{owner}: {name} is a text, so give tokenizers=(src_tok, tgt_tok) to read it; or "
                             f"give token ids, got {value!r:.60}")
        value = tokenizer.encode(value)
    value = backend.to_numpy(value) if hasattr(value, "shape") else list(value)
    return [int(i) for i in checks.token_ids(owner, name, value, vocab_size, ndim=1)]


def _labeller(tokenizer, config):
    if tokenizer is not None:
        return tokenizer.token_labels
    names = {config.pad_id: "<pad>", config.bos_id: "<bos>", config.eos_id: "<eos>"}
    return lambda ids: [names.get(i, str(i)) for i in ids]


def _forward_backward(model, src, tgt_in, tgt_out) -> tuple:
    """Loss, logits (T,V) and per stack the layers' A, dL/dA, and what ``_head_paths`` gives: each head's share and
    |g_h|, and the q, k, scale and mask each A came from. Parameter gradients stay as they were."""
    grads, xp = [p.grad.copy() for p in model.parameters()], backend.xp()
    by_stack = {"encoder": [layer.self_attn.attention for layer in model.encoder.layers],       # attention cores
                "decoder_self": [layer.self_attn.attention for layer in model.decoder.layers],
                "decoder_cross": [layer.cross_attn.attention for layer in model.decoder.layers]}
    logits = model(numpy.asarray([src]), numpy.asarray([tgt_in]))                 # (1,T,V)
    loss_fn = CrossEntropyLoss(ignore_index=model.config.pad_id)
    loss = loss_fn(logits, numpy.asarray([tgt_out]))
    watched = [model.src_embed, model.tgt_embed, *sum(by_stack.values(), [])]
    for m in watched:
        m.keep_dout = True
    model.backward(loss_fn.backward())
    douts = {m: m.dout for m in watched}                       # module -> the dout its backward got
    for m in watched:
        m.keep_dout, m.dout = False, None
    stacks = {name: {"attn": _pack(xp.stack([a.attn[0] for a in cores])),                  # (L,H,Tq,Tk) each
                     "dattn": _pack(xp.stack([a.dattn[0] for a in cores]))}      # read before _head_paths reruns them
              for name, cores in by_stack.items()}
    for name, paths in _head_paths(model, src, tgt_in, douts).items():
        stacks[name].update(paths)
    for p, g in zip(model.parameters(), grads):
        p.grad[...] = g
    return loss, backend.to_numpy(logits[0]), stacks


def _head_paths(model, src, tgt_in, douts) -> dict:
    """Per stack, each layer's q and k (H,T,Dk), the scores' scale and mask (Tq,Tk), and per head (L,H) ``share``,
    <g_h, g> / |g|^2 of the gradient g reaching the embeddings (the stacks' inputs: the source for encoder and cross
    heads, the target for decoder self heads), and ``grad_norm``, |g_h|; g_h is the part of g on the paths through
    the head (a cross head's: through its keys and values). The backward pass is linear: g_h is the head's own dout
    (douts) taken back alone, through its projections and attention core (below W_o, which mixes the heads), then
    the layers below, so a layer's g_h and the paths that miss its heads add up to g. Each head is a row of a batch
    that joins, from the top layer down, the rows going through the layers below, run on that many copies of the
    sentence."""
    xp, H, enc, dec = backend.xp(), model.config.num_heads, model.encoder, model.decoder
    src, tgt = backend.asarray(numpy.asarray([src])), backend.asarray(numpy.asarray([tgt_in]))
    src_mask, tgt_mask = model.src_mask(src), model.tgt_mask(tgt)
    # Each layer's input (1,T,D), the stack's output last (no dropout in eval mode); mids: each cross-attention's input
    xs = [model.src_pos.forward(model.src_embed.forward(src))]
    for layer in enc.layers:
        xs.append(layer.forward(xs[-1], src_mask))
    memory = xs[-1] if enc.norm is None else enc.norm.forward(xs[-1])                         # (1,S,D)
    ys, mids = [model.tgt_pos.forward(model.tgt_embed.forward(tgt))], []
    for layer in dec.layers:
        mids.append(layer.sublayer_self.forward(ys[-1], lambda h: layer.self_attn.forward(h, h, h, tgt_mask)))
        ys.append(layer.forward(ys[-1], memory, tgt_mask, src_mask))
    one_hot = xp.eye(H, dtype=memory.dtype)[:, :, None, None]                                     # (H,H,1,1)
    seen = {}                                                  # attention -> its q, k (H,T,Dk), as ``own`` met them

    def rows(x, n):
        return xp.repeat(x, n, axis=0)

    def own(sub, mha, x, mask, memory=None):   # row h: head h's part alone, from its output back to the sublayer's x
        x = rows(x, H)                                                                            # (H,T,D)
        query = sub.norm.forward(x) if sub.norm_first else x                                      # what mha reads
        kv = query if memory is None else rows(memory, H)
        q, k, v = (mha.split_heads(W.forward(t)) for W, t in ((mha.W_q, query), (mha.W_k, kv), (mha.W_v, kv)))
        seen[mha] = q[0], k[0]                                 # every row holds the sentence's q and k   (H,T,Dk)
        mha.attention.forward(q, k, v, mask)
        dq, dk, dv = mha.attention.backward(douts[mha.attention] * one_hot)              # (rows, heads, T, Dk) ...
        dq, dk, dv = (W.backward(mha.merge_heads(d)) for W, d in ((mha.W_q, dq), (mha.W_k, dk), (mha.W_v, dv)))
        if memory is not None:
            return dk + dv                                     # a cross head: to the memory, by keys and values
        return sub.norm.backward(dq + dk + dv) if sub.norm_first else dq + dk + dv

    dy, cross = ys[0][:0], []                                  # rows: H a layer, top layer first; none at first
    for layer, y, mid in reversed(list(zip(dec.layers, ys, mids))):
        layer.forward(rows(y, len(dy)), rows(memory, len(dy)), tgt_mask, src_mask)
        dy = xp.concatenate([layer.backward(dy)[0], own(layer.sublayer_self, layer.self_attn, y, tgt_mask)])
        cross.insert(0, own(layer.sublayer_cross, layer.cross_attn, mid, src_mask, memory))
    dx = xp.concatenate(cross)                                 # (L*H,S,D), bottom layer first
    if enc.norm is not None:
        enc.norm.forward(rows(xs[-1], len(dx)))
        dx = enc.norm.backward(dx)
    for layer, x in reversed(list(zip(enc.layers, xs))):
        layer.forward(rows(x, len(dx)), src_mask)
        dx = xp.concatenate([layer.backward(dx), own(layer.sublayer_attn, layer.self_attn, x, src_mask)])
    g_src, g_tgt = douts[model.src_embed].reshape(-1), douts[model.tgt_embed].reshape(-1)       # (S*D,), (T*D,)
    L, E = len(dec.layers), len(enc.layers)
    parts = {"encoder": (dx[L * H:].reshape(E, H, -1)[::-1], g_src, [e.self_attn for e in enc.layers], src_mask),
             "decoder_self": (dy.reshape(L, H, -1)[::-1], g_tgt, [d.self_attn for d in dec.layers], tgt_mask),
             "decoder_cross": (dx[:L * H].reshape(L, H, -1), g_src, [d.cross_attn for d in dec.layers], src_mask)}
    found = {}
    for name, (g_h, g, mhas, mask) in parts.items():           # g_h (layers,H,T*D), bottom layer first
        paths = backend.to_numpy(xp.stack([g_h @ g / xp.maximum(g @ g, 1e-30), xp.sqrt((g_h * g_h).sum(-1))], -1))
        q, k = xp.stack([seen[m][0] for m in mhas]), xp.stack([seen[m][1] for m in mhas])        # (L,H,T,Dk)
        scale = 1 / math.sqrt(mhas[0].d_k) if mhas[0].attention.scale else 1.0                  # as the scores had
        mask = xp.broadcast_to(mask[0, 0], (q.shape[2], k.shape[2]))                                # (Tq,Tk)
        found[name] = {"share": paths[..., 0].tolist(), "grad_norm": paths[..., 1].tolist(), "q": _pack(q),
                       "k": _pack(k), "scale": scale, "mask": _pack(mask)}
    return found


def _decoding(logits, hyp, ended: bool, cross, eos_id: int, beam: list, alpha: float, label) -> dict:
    """The output step by step, from the logits (T,V) of the decoder fed [BOS] + hyp: at step t the token chosen and
    the TOP_K most probable next tokens; cross (L,H,T,S), the cross-attention of those steps, when it is not the
    page's decoder_cross stack already (a given target); beam, what beam search's steps argument collected: each
    step's hypotheses [text up to EOS, score, whether the output grows from it], those with a finite score."""
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= numpy.log(numpy.exp(log_p).sum(-1, keepdims=True))                  # (T,V)
    chosen = hyp + [eos_id if ended else int(log_p[-1].argmax())]     # cut: what it would have said next
    top = numpy.argsort(-log_p, axis=-1)[:, :TOP_K]                             # (T,k) the k best, best first
    steps = [{"token": label([token])[0], "p": float(numpy.exp(log_p[t, token])),
              "top": [[label([int(i)])[0], float(numpy.exp(log_p[t, i]))] for i in top[t]]}
             for t, token in enumerate(chosen)]
    total = float(sum(log_p[t, token] for t, token in enumerate(chosen)))
    grown = chosen + [eos_id] * len(beam)                     # an ended hypothesis is fed EOS from then on
    search = [[[" ".join(label(ids[: ids.index(eos_id) + 1] if eos_id in ids else ids)), float(s), ids == grown[:t + 1]]
               for ids, s in zip(tokens[0].tolist(), scores[0]) if numpy.isfinite(s)]
              for t, (_, tokens, scores) in enumerate(beam)]
    width = len(beam[0][1][0]) if beam else 1                # K: the hypotheses (b,K,t) of the first step
    return {"method": f"beam search, beam {width}, alpha {alpha:g}" if beam else "greedy",
            "log_p": total, "score": total / float(decoding.length_penalty(len(chosen), alpha)),
            "steps": steps, "beam": search or None, "cross": None if cross is None else _pack(cross)}


def build(model, src, tgt=None, *, tokenizers=None, beam_size: int = 1, alpha: float = 0.6) -> dict:
    """The page's data for one sentence (see the module docstring); the model's mode is left as it was."""
    owner = "explain"
    if not isinstance(model, Transformer):
        raise TypeError(f"{owner}: model must be a minitransformer Transformer (core or fast), got "
                        f"{type(model).__name__}")
    if tokenizers is not None and (not isinstance(tokenizers, (tuple, list)) or len(tokenizers) != 2):
        raise ValueError(f"{owner}: tokenizers must be a pair (source tokenizer, target tokenizer), got "
                         f"{tokenizers!r:.80}")
    beam_size = checks.int_in(owner, "beam_size", beam_size, 1, decoding.MAX_BEAM)
    alpha = checks.non_negative(owner, "alpha", alpha)
    c = model.config
    src_tok, tgt_tok = tokenizers or (None, None)
    src_label, tgt_label = _labeller(src_tok, c), _labeller(tgt_tok, c)
    src = _ids(owner, "src", src, src_tok, c.src_vocab_size)
    limit = min(MAX_TOKENS, c.max_len)
    given = None if tgt is None else _ids(owner, "tgt", tgt, tgt_tok, c.tgt_vocab_size)[: limit - 1]
    notes = [f"the source has {len(src)} tokens: the first {limit} are shown"] if len(src) > limit else []
    src = src[:limit]
    with decoding.eval_mode(model):                    # and back to the mode it had
        beam = []
        search = {"beam_size": beam_size, "alpha": alpha, "steps": beam} if beam_size > 1 else {}
        hyp = (decoding.beam_search if search else decoding.greedy_decode)(model, numpy.asarray([src]),
                                                                          max_len=limit - 1, **search)[0]
        ended = len(hyp) < limit - 1
        if not ended:
            notes.append(f"the output was cut at {limit - 1} tokens")
        target = hyp if given is None else given
        tgt_in, tgt_out = [c.bos_id] + target, target + [c.eos_id]
        loss, logits, stacks = _forward_backward(model, src, tgt_in, tgt_out)
        cross = None                                   # the output's own pass: the decoding is the page's stacks
        if given is not None:                          # the output, teacher-forced: the rows decoding saw
            logits = backend.to_numpy(model(numpy.asarray([src]), numpy.asarray([[c.bos_id] + hyp]))[0])
            cross = numpy.stack(model.attention_maps()["decoder_cross"])[:, 0]                        # (L,H,T,S)
        steps = _decoding(numpy.asarray(logits, numpy.float64), hyp, ended, cross, c.eos_id, beam, alpha, tgt_label)
    sizes = ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "positional")
    positions = model.src_pos.pe if hasattr(model.src_pos, "pe") else model.src_pos.P.data
    return {"src": src_label(src), "tgt_in": tgt_label(tgt_in), "tgt_out": tgt_label(tgt_out),
            "target": "the model's own output" if given is None else "the given target", "loss": loss,
            "notes": notes, "config": {k: getattr(c, k) for k in sizes},
            "tier": "fast" if isinstance(model, fast.Transformer) else "core", "decoding": steps, "output_ids": hyp,
            "stacks": stacks, "pe": _pack(positions[: max(len(src), len(tgt_in))])}                  # pe (T,D)


def page(data: dict) -> str:
    """One self-contained HTML page: the data, the script and the style inline; nothing fetched."""
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")    # no "</script>" inside
    style, script = (Path(__file__).with_name(f"viewer.{ext}").read_text("utf-8") for ext in ("css", "js"))
    title = html.escape(" ".join(data["src"]))
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\">"
            f"<title>explain: {title}</title><style>{style}</style></head><body>"
            f"<script type=\"application/json\" id=\"explain-data\">{payload}</script>"
            f"<script>{script}</script></body></html>\n")
