"""The inputs every exercise is checked on, and the checks every forward and backward must pass, with any copy of
the core (the package, a student's, the grader's sandbox): one file that check.py, the grader and the student's
sandbox all read, so that a student never sees PASS where the grader fails. Sizes are small, odd where they can be
and all distinct, so that a transposed or mis-broadcast gradient cannot pass by accident; token batches carry
padding, one source is padding alone (its queries have no key). Nothing here imports minitransformer."""

from __future__ import annotations

import copy
import functools
import inspect
import traceback
from pathlib import Path

import numpy

B, S, T, D, H, F, V = 3, 7, 5, 6, 2, 11, 13


def cases(mt, name: str, rng) -> list:
    """[(label, module, inputs)] for the exercise ``name`` ('linear' also serves 'linear.forward'), built
    with the package ``mt``; call after ``mt.set_default_dtype("float64")``."""
    L, masks, model, wrap = mt.layers, mt.masks, mt.model, mt.gradcheck     # wrap: modules of one input

    def x(*shape):
        return rng.standard_normal(shape)

    def ids(rows, length, low=4, high=V):
        out = rng.integers(low, high, size=(rows, length))     # (rows, length)
        out[1, length - 2:] = 0                                # padding at the end of a sentence
        return out

    src, tgt = ids(B, S), ids(B, T)
    src[2, 1:] = 0                                             # a source that is one token and padding
    src_mask, keyless = masks.padding_mask(src, 0), masks.padding_mask(src, 0).copy()
    keyless[2] = False                                         # a sentence whose queries have no key at all
    tgt_mask = masks.padding_mask(tgt, 0) & masks.subsequent_mask(T)
    config = model.TransformerConfig(V, V, d_model=D, num_heads=H, num_encoder_layers=1, num_decoder_layers=2,
                                     d_ff=F, dropout=0.0, max_len=16, share_embeddings=True, tie_output=True)
    loss = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    build = {
        "linear": lambda: [("Linear(6, 4)", L.Linear(D, 4), (x(B, T, D),))],
        "relu": lambda: [("ReLU", L.ReLU(), (x(B, T, D),))],
        "softmax": lambda: [("Softmax over keys", L.Softmax(axis=-1), (x(B, H, T, S),))],
        "dropout": lambda: [("Dropout(0.3), training", L.Dropout(0.3), (x(B, T, D),))],
        "embedding": lambda: [("Embedding(13, 6), repeated ids", L.Embedding(V, D, scale=True),
                               (rng.integers(0, 4, size=(B, T)),))],
        "feedforward": lambda: [("PositionwiseFeedForward(6, 11), dropout 0.2",
                                 L.PositionwiseFeedForward(D, F, dropout=0.2), (x(B, T, D),))],
        "layernorm": lambda: [("LayerNorm(6)", L.LayerNorm(D), (x(B, T, D) * 3 + 1,))],
        "attention": lambda: [
            ("cross-attention, padding, a keyless row", L.ScaledDotProductAttention(),
             (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 4), keyless)),
            ("self-attention, causal, dropout 0.2", L.ScaledDotProductAttention(dropout=0.2),
             (x(B, H, T, 3), x(B, H, T, 3), x(B, H, T, 3), tgt_mask))],
        "multihead": lambda: [
            ("cross-attention", L.MultiHeadAttention(D, H), (x(B, T, D), x(B, S, D), x(B, S, D), src_mask)),
            ("self-attention, causal", wrap.SelfAttention(L.MultiHeadAttention(D, H)), (x(B, T, D), tgt_mask))],
        "sublayer": lambda: [("post-LN around an FFN", wrap.AroundFFN(D, F), (x(B, T, D),)),
                             ("pre-LN around an FFN", wrap.AroundFFN(D, F, norm_first=True), (x(B, T, D),))],
        "encoder_layer": lambda: [("EncoderLayer, dropout 0.1", model.EncoderLayer(D, H, F, dropout=0.1),
                                   (x(B, S, D), src_mask))],
        "decoder_layer": lambda: [("DecoderLayer", model.DecoderLayer(D, H, F),
                                   (x(B, T, D), x(B, S, D), tgt_mask, src_mask))],
        "transformer": lambda: [("Transformer, shared and tied embeddings", model.Transformer(config), (src, tgt))],
        "loss": lambda: [("CrossEntropyLoss, smoothing 0.1, padding", wrap.LossOfLogits(loss, ids(B, T, 0, V)),
                          (x(B, T, V),))],
    }
    built = build[name.split(".")[0]]()
    for _, module, _ in built:         # a bias of zeros or a gain of ones would hide a mistake that drops it
        for p in module.parameters():
            if (p.data == p.data.reshape(-1)[0]).all():
                p.data[...] = p.data + 0.1 * rng.standard_normal(p.data.shape)
    return built


def prepare(mt, name: str, seed: int, given=None) -> list:
    """[(label, module, inputs, trial)]: the cases of seed (check.py's public ones are seed 0), each with its trial:
    the rng state before forward, the forward's output shape, a random dout and .grad to pre-fill. given: the
    grader's trials ({before, after, out_shape} each), for a copy whose forward may not be written yet."""
    mt.manual_seed(seed)
    rng = numpy.random.default_rng(seed)
    built = []
    for i, (label, module, inputs) in enumerate(cases(mt, name, rng)):
        if given is None:
            trial = {"before": mt.backend.get_rng_state(), "out_shape": tuple(module.forward(*inputs).shape)}
            module.clear_caches()
        else:
            trial = {**given[i], "out_shape": tuple(given[i]["out_shape"])}
        trial.update(dout=rng.standard_normal(trial["out_shape"]),
                     grad={n: rng.standard_normal(p.data.shape) for n, p in module.named_parameters()})
        built.append((label, module, inputs, trial))
    return built


class Failed(Exception):
    """A one-line reason an exercise fails."""


UNLOADED = "your transformer package does not load, so no exercise runs (nor check.py)"


def describe(err: BaseException, root: str = "") -> str:
    """'ValueError: ... (layers/linear.py line 47)': the error's first line and, given the student's folder (root),
    the last line of their code it passed through; a Failed is its reason, a stub's NotImplementedError work not
    written yet."""
    if isinstance(err, Failed):
        return str(err)
    if isinstance(err, NotImplementedError):
        return f"not written yet ({err})"
    text = (str(err).strip().splitlines() or [""])[0]
    where = [f for f in traceback.extract_tb(err.__traceback__) if root and f.filename.startswith(root)]
    place = f" ({Path(where[-1].filename).relative_to(root)} line {where[-1].lineno})" if where else ""
    return f"{type(err).__name__}: {text.replace(f'{root}/', '') if root else text}"[:300] + place


def swap(module, subs: dict):
    """The module with every part whose class is in subs switched to its subclass (the loss inside a wrapper too)."""
    for m in module.modules():
        for part in (m, getattr(m, "loss_fn", None)):
            if type(part) in subs:
                part.__class__ = subs[type(part)]
    return module


def counting(module, calls: list):
    """Every class in module counts its forward's calls into calls[0] while calls[1] is set (during backward): a
    backward that calls forward differentiates numerically, which a hand-written backward never does."""
    for cls in {type(m) for m in module.modules()}:
        if "_counts" not in vars(cls):
            @functools.wraps(cls.forward)
            def forward(self, *args, _forward=cls.forward, **kwargs):
                calls[0] += calls[1]
                return _forward(self, *args, **kwargs)
            cls.forward, cls._counts = forward, True
    return module


def run(backend, module, inputs, subs, trial, root="", calls=None) -> dict:
    """One forward and one backward of a copy of module with subs swapped in, as trial fixes them (rng states,
    dout, pre-filled .grad), through the checks every exercise passes. Returns the tensors {name: array}, or
    {"error": (stage, text), "shown": text with the place in the student's code, "type": the error's class}.
    calls: [0, 0] to count the forward calls a backward makes."""
    m = swap(copy.deepcopy(module), subs)
    names = list(inspect.signature(type(module).forward).parameters)[1:]
    xs = [x.copy() if isinstance(x, numpy.ndarray) else x for x in inputs]

    def check(stage, labels, values, shapes):     # the inputs left as they came, each value an array of its shape
        for name, x, y in zip(names, xs, inputs):
            if isinstance(y, numpy.ndarray) and not numpy.array_equal(x, y):
                raise Failed(f"{stage} changed the input {name} in place (the caller still holds it)")
        for label, value, shape in zip(labels, values, shapes):
            if shape and (not isinstance(value, numpy.ndarray) or value.shape != shape):
                got = getattr(value, "shape", type(value).__name__)
                raise Failed(f"{stage} returned {got} for {label}, expected an array of shape {shape}")

    stage = "forward"
    try:
        backend.set_rng_state(trial["before"])
        out = m(*xs)
        check(stage, ["out"], [out], [tuple(trial["out_shape"])])
        tensors, stage = {"out": out.copy()}, "backward"
        backend.set_rng_state(trial.setdefault("after", backend.get_rng_state()))
        for name, p in m.named_parameters():
            p.grad[...] = trial["grad"][name]
        dout = trial["dout"].copy()
        if calls is not None:
            counting(m, calls)
            calls[1] = 1
        grads = m.backward(dout)
        if calls is not None and calls[0]:
            raise Failed(f"backward ran the forward {calls[0]} times: a numerical derivative (differences of "
                         "forward) is not a backward written by hand; the grader takes only the chain rule")
        if not numpy.array_equal(dout, trial["dout"]):
            raise Failed("backward changed dout in place (write dout * 2, not dout *= 2: the caller still needs it)")
        floats = [x.shape if isinstance(x, numpy.ndarray) and x.dtype.kind == "f" else None for x in inputs]
        grads = [*(grads if isinstance(grads, (tuple, list)) else [grads]), *[None] * len(names)]
        check(stage, [f"d{name}" for name in names], grads, floats)
        unused = [name or "the module" for name, part in m.named_modules()
                  if part._cache is not None or getattr(getattr(part, "loss_fn", None), "cache", None) is not None]
        if unused:      # the next forward in training would raise: each forward is followed by one backward
            raise Failed(f"backward left the forward's cache of {unused[0]} unused (each backward takes it back "
                         "once, with self.saved(dout))")
        tensors.update((f"d{name}", g.copy()) for name, g, shape in zip(names, grads, floats) if shape)
        tensors.update((f"{name}.grad", p.grad.copy()) for name, p in m.named_parameters())
        bad = [n for n, t in tensors.items() if not numpy.isfinite(t).all()]
        if bad:
            raise Failed(f"{stage} gave NaN or inf in {bad[0]}")
        return tensors
    except Exception as err:  # noqa: BLE001 - whatever a student's code raises costs this exercise
        # The message alone is compared with the mistakes', the student reads where it came from.
        return {"error": (stage, describe(err)), "shown": describe(err, root), "type": type(err).__name__}
