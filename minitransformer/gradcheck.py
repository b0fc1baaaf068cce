"""Finite-difference gradient checking of any Module: does backward agree with forward?

For a module f and a random upstream gradient g (the same shape as f's output), the scalar
    L(x, theta) = sum(f(x; theta) * g)
has dL/dx = backward(g) and dL/dtheta = theta.grad. Each is compared with the central difference
    dL/dz_i  ~  (L(z + eps e_i) - L(z - eps e_i)) / (2 eps)
for every float input and every parameter. Projecting on a RANDOM g (not all ones) matters: with
g = 1, LayerNorm's input gradient is zero whatever backward computes, and a wrong backward passes.

g comes from a generator of its own (``UPSTREAM_STREAM``), so an input drawn with the same seed is not g:
LayerNorm's input gradient for a g parallel to x is almost zero, which a check should not have to meet by chance.
Every array handed to forward and backward is a private copy: a backward that edits ``dout`` in place cannot
change the g the finite differences use, nor forward its input.
Run it in float64: float32 rounding makes the difference quotient noise (relative error ~1e-2).

    mt.set_default_dtype("float64")
    layer = mt.layers.LayerNorm(6)
    print(mt.gradcheck.check(layer, x))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy

from . import backend, checks, layers
from .module import Module

DEFAULT_TOLERANCE = 1e-6
# Below this magnitude both gradients are "zero" within float64 rounding of the difference quotient
# (about 1e-16 * |L| / eps ~ 1e-10 here). Some gradients are exactly zero by the mathematics: the key
# projection's bias shifts every score of a row by the same amount, which softmax ignores.
ZERO_GRADIENT = 1e-8
ROUNDING_UNITS = 16  # how many roundings of an output the difference quotient's noise estimate allows for
UPSTREAM_STREAM = 0x6772  # g is drawn from default_rng([UPSTREAM_STREAM, seed]), not from default_rng(seed)


@dataclass
class Row:
    """One tensor's comparison. ``worst`` is the flat index where |analytic - numeric| is largest."""

    name: str
    shape: tuple
    checked: int
    rel_error: float
    max_abs_error: float
    worst: int
    analytic: float
    numeric: float
    zero: bool = False  # analytic and numeric both below ZERO_GRADIENT: agree that the gradient is zero
    assigned: bool = False  # backward wrote .grad = g instead of adding (.grad += g): what it left is g alone

    def passes(self, tolerance: float) -> bool:
        return not self.assigned and (self.zero or self.rel_error < tolerance)

    def verdict(self, tolerance: float) -> str:
        if self.assigned:
            return "FAIL: backward assigned .grad (=) instead of adding to it (+=)"
        if not self.passes(tolerance):
            return "FAIL"
        return "ok: zero, both ways" if self.zero else "ok"

    def worst_entry(self) -> str:
        index = tuple(int(i) for i in numpy.unravel_index(self.worst, self.shape)) if self.shape else ()
        return f"{list(index)}: analytic {self.analytic:.6g}, numeric {self.numeric:.6g}"


@dataclass
class GradcheckReport:
    """The result of ``check``: one row per input and parameter, printable as a table.

    rel_error of a tensor = max_i |a_i - n_i| / max(1e-8, floor, max_i |a_i| + max_i |n_i|),
    the analytic gradient a against the numeric one n, over the entries checked (CS231n's measure, taken over
    the tensor). floor = noise / tolerance, where noise = ROUNDING_UNITS * 2^-52 * sum|f * g| / eps bounds the rounding of the
    difference quotient: a gradient smaller than the floor is judged by its absolute error, so a gradient that
    is nearly zero everywhere cannot turn rounding noise into a large relative error. A tensor passes when
    rel_error < tolerance; a "zero gradient" row (every |a_i|, |n_i| < ZERO_GRADIENT) is one where both agree
    that the mathematics gives zero.
    """

    module: str
    rows: list = field(default_factory=list)
    tolerance: float = DEFAULT_TOLERANCE

    @property
    def max_error(self) -> float:
        """The largest relative error over the tensors whose gradient is not zero."""
        return max((r.rel_error for r in self.rows if not r.zero), default=0.0)

    @property
    def ok(self) -> bool:
        return all(r.passes(self.tolerance) for r in self.rows)

    def failures(self):
        return [r for r in self.rows if not r.passes(self.tolerance)]

    def assert_ok(self, tolerance: float | None = None) -> None:
        """Raise AssertionError naming each tensor whose relative error is not below the tolerance."""
        tol = self.tolerance if tolerance is None else tolerance
        bad = [r for r in self.rows if not r.passes(tol)]
        if bad:
            lines = [f"{self.module}: gradient check failed (tolerance {tol:.0e})"]
            for r in bad:
                lines.append(f"  {r.name}{r.worst_entry()}, relative error {r.rel_error:.2e}: {r.verdict(tol)}")
            raise AssertionError("\n".join(lines))

    def table(self) -> str:
        width = max([len(r.name) for r in self.rows] + [6])
        head = (f"{'tensor':<{width}}  {'shape':<14} {'checked':>7}  {'rel. error':>10}  "
                f"{'worst entry [index]: analytic, numeric':<52}  verdict")
        lines = [f"gradient check of {self.module} (float64, central differences)", head, "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r.name:<{width}}  {r.shape!s:<14} {r.checked:>7}  {r.rel_error:>10.2e}  "
                         f"{r.worst_entry():<52}  {r.verdict(self.tolerance)}")
        lines.append(f"max relative error {self.max_error:.2e}  (bound {self.tolerance:.0e}): "
                     f"{'PASS' if self.ok else 'FAIL'}")
        if any(r.zero for r in self.rows):
            lines.append("zero, both ways: analytic and numeric gradients are both below 1e-8 everywhere, as the "
                         "mathematics says (a key projection's bias shifts every score of a row alike, which "
                         "softmax ignores)")
        return "\n".join(lines)

    __str__ = table

    def _repr_html_(self) -> str:  # shown by Jupyter
        cells = "".join(
            f"<tr><td><code>{r.name}</code></td><td>{r.shape}</td><td>{r.checked}</td>"
            f"<td>{r.rel_error:.2e}</td><td>{r.worst_entry()}</td><td>{r.verdict(self.tolerance)}</td></tr>"
            for r in self.rows
        )
        return (f"<b>gradient check of {self.module}</b> — max relative error {self.max_error:.2e} "
                f"(bound {self.tolerance:.0e}): <b>{'PASS' if self.ok else 'FAIL'}</b>"
                "<table><tr><th>tensor</th><th>shape</th><th>checked</th><th>rel. error</th><th>worst entry</th><th></th></tr>"
                f"{cells}</table>")


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check(module, *inputs, eps: float = 1e-6, max_entries: int | None = None, seed: int = 0,
          tolerance: float = DEFAULT_TOLERANCE, parameters: bool = True) -> GradcheckReport:
    """Compare ``module.backward`` with central finite differences.

    module      a Module whose parameters are float64 (build it after ``mt.set_default_dtype("float64")``)
    inputs      the forward's positional arguments. Float arrays are checked; integer arrays (token ids),
                boolean masks and None are passed through unchanged (host arrays moved to the backend).
    eps         the step of the central difference
    max_entries check at most this many entries per tensor, chosen at random (None: all of them)
    seed        seeds the upstream gradient and the sampled entries. Dropout masks come from the backend's
                generators as they are at the call (``mt.manual_seed`` sets them), and the same mask is
                drawn at every forward, so a module with dropout can be checked in training mode
    Returns a GradcheckReport: ``print(report)`` gives the table, ``report.assert_ok()`` raises on failure.
    """
    if not isinstance(module, Module):
        raise TypeError(f"gradcheck.check: module must be a minitransformer Module, got {type(module).__name__}")
    checks.positive_number("gradcheck.check", "eps", eps)
    checks.positive_number("gradcheck.check", "tolerance", tolerance)
    if max_entries is not None:
        checks.positive_int("gradcheck.check", "max_entries", max_entries)
    xp = backend.xp()
    params = module.named_parameters() if parameters else []
    for name, p in params:
        if p.data.dtype != numpy.float64:
            raise ValueError(f"gradcheck.check: module's parameter {name!r} is {p.data.dtype}; finite differences need "
                             f"float64. Call mt.set_default_dtype('float64') before building the module.")
    # Host arrays move to the active backend: float ones as float64 (they are checked), token ids and
    # masks as they are (on CuPy a NumPy mask cannot meet device scores in xp.where). No-ops on NumPy.
    inputs = [xp.asarray(x, dtype=numpy.float64) if isinstance(x, (numpy.ndarray, float)) and
              numpy.asarray(x).dtype.kind == "f" else xp.asarray(x) if isinstance(x, numpy.ndarray) else x
              for x in inputs]
    float_inputs = [i for i, x in enumerate(inputs) if backend.is_array(x) and x.dtype.kind == "f"]
    # Each float input gets its own copy: self-attention called as check(mha, x, x, x) must perturb
    # query, key and value one at a time, as separate inputs, and the caller's arrays stay untouched.
    for i in float_inputs:
        inputs[i] = inputs[i].copy()

    rng_state = backend.get_rng_state()
    check_rng = numpy.random.default_rng(seed)

    def run_forward():
        backend.set_rng_state(rng_state)  # the same dropout mask at every forward
        module.clear_caches()             # many forwards, one backward: forget the last forward's cache
        return _as_tuple(module(*[x.copy() if backend.is_array(x) else x for x in inputs]))

    # Analytic: one forward, one backward with a random upstream gradient g. Each .grad starts at a known
    # nonzero value, so that a backward that assigns (.grad = dW) instead of adding (.grad += dW) shows.
    outputs = run_forward()
    upstream_rng = numpy.random.default_rng([UPSTREAM_STREAM, seed])
    upstream = [xp.asarray(upstream_rng.standard_normal(o.shape)) for o in outputs]  # g, one per output
    before = {name: check_rng.standard_normal(p.data.shape) for name, p in params}
    for name, p in params:
        p.grad[...] = xp.asarray(before[name])
    grads = module.backward(*[g.copy() for g in upstream])
    grads = _as_tuple(grads)
    left = {name: backend.to_numpy(p.grad).copy() for name, p in params}          # what backward left in .grad
    for name, p in params:
        p.grad[...] = xp.asarray(left[name] - before[name])                        # the gradient it added

    # L is taken relative to the unperturbed outputs: sum((f(z) - f(z0)) * g). The constant f(z0) does not
    # change the difference quotient, but subtracting it elementwise first avoids the rounding of large
    # terms (such as a masked score of -1e9) that would otherwise swamp the tiny difference.
    reference = [o.copy() for o in outputs]
    # The rounding of L's difference: some units of 2^-52 of sum|f * g|, over the outputs that move (a masked
    # score, -1e9, is a constant and rounds the same at every forward). Some units, not one: each output comes
    # out of a chain of rounded operations (a whole model's, for the Transformer), ROUNDING_UNITS of them.
    moving = [xp.where(xp.abs(o) < 1e8, xp.abs(o), 0.0) for o in outputs]
    noise = ROUNDING_UNITS * 2.0**-52 * sum(float((m * xp.abs(g)).sum()) for m, g in zip(moving, upstream)) / eps

    def loss() -> float:
        return float(sum(float(((o - r) * g).sum()) for o, r, g in zip(run_forward(), reference, upstream)))

    targets = []  # (name, array to perturb, analytic gradient)
    for i in float_inputs:
        if i >= len(grads) or grads[i] is None:
            raise ValueError(f"gradcheck.check: backward of {type(module).__name__} returned no gradient for "
                             f"input {i}")
        targets.append((f"input[{i}]", inputs[i], backend.to_numpy(grads[i]).copy()))
    for name, p in params:
        targets.append((name, p.data, left[name] - before[name]))

    report = GradcheckReport(module=type(module).__name__, tolerance=tolerance)
    for name, array, analytic in targets:
        if analytic.shape != tuple(array.shape):
            raise ValueError(f"gradcheck.check: gradient of {name} has shape {analytic.shape}, "
                             f"expected {tuple(array.shape)}")
        flat = array.reshape(-1)  # a view: perturbing it perturbs the array the module reads
        n = flat.size
        picks = numpy.arange(n) if max_entries is None or n <= max_entries else \
            numpy.sort(check_rng.choice(n, size=max_entries, replace=False))
        numeric = numpy.empty(len(picks))
        for j, idx in enumerate(picks):
            old = float(flat[idx])
            flat[idx] = old + eps
            plus = loss()
            flat[idx] = old - eps
            minus = loss()
            flat[idx] = old
            numeric[j] = (plus - minus) / (2 * eps)
        a = analytic.reshape(-1)[picks]
        diff = numpy.abs(a - numeric)
        worst = int(numpy.argmax(diff)) if len(picks) else 0
        scale = max(1e-8, noise / tolerance, float(numpy.abs(a).max(initial=0.0) + numpy.abs(numeric).max(initial=0.0)))
        raw = left[name].reshape(-1)[picks] if name in left else None     # assigned: raw equals the gradient
        assigned = raw is not None and diff.max(initial=0.0) / scale >= tolerance and \
            numpy.abs(raw - numeric).max(initial=0.0) / scale < tolerance
        report.rows.append(Row(assigned=bool(assigned), name=name, shape=tuple(array.shape), checked=len(picks),
                               rel_error=float(diff.max(initial=0.0)) / scale,
                               max_abs_error=float(diff.max(initial=0.0)),
                               worst=int(picks[worst]) if len(picks) else 0,
                               analytic=float(a[worst]) if len(picks) else 0.0,
                               numeric=float(numeric[worst]) if len(picks) else 0.0,
                               zero=max(numpy.abs(a).max(initial=0.0), numpy.abs(numeric).max(initial=0.0))
                               < ZERO_GRADIENT))
    # Leave the module as one forward + backward leaves it: .grad holds the analytic gradients
    # (the numeric forwards never touch them) and the random generators are where they were.
    module.clear_caches()
    backend.set_rng_state(rng_state)
    return report


# Modules of one input around what is not one, so that ``check`` treats them like any layer: self-attention (one
# input read as query, key and value), a sublayer connection with its sublayer, and the loss.

class SelfAttention(Module):
    """Self-attention as a module of one input: forward(x, mask) = MHA(x, x, x, mask); dx = dq + dk + dv."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x, mask=None):
        out = self.mha(x, x, x, mask)                                          # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        dq, dk, dv = self.mha.backward(dout)
        return dq + dk + dv                                                    # (B,T,D)


class AroundFFN(Module):
    """The paper's sublayer connection around a feed-forward network, as EncoderLayer uses it:
    forward(x) = LayerNorm(x + Dropout(FFN(x))) (or x + Dropout(FFN(LayerNorm(x))) with norm_first);
    backward adds the path around the FFN to the path through it."""

    def __init__(self, d_model, d_ff, norm_first=False):
        super().__init__()
        self.ffn = layers.PositionwiseFeedForward(d_model, d_ff)
        self.sublayer = layers.SublayerConnection(d_model, dropout=0.3, norm_first=norm_first)

    def forward(self, x):
        out = self.sublayer(x, self.ffn)                                       # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        return self.sublayer.backward(dout, self.ffn.backward)                 # (B,T,D)


class LossOfLogits(Module):
    """CrossEntropyLoss as a module of the logits, so that gradcheck treats it like a layer."""

    def __init__(self, loss_fn, target):
        super().__init__()
        self.loss_fn, self.target = loss_fn, target

    def forward(self, logits):
        out = numpy.asarray(self.loss_fn(logits, self.target))                 # () the loss
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        return self.loss_fn.backward() * dout                                  # (B,T,V)
