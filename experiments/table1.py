"""Table 1 of the paper, measured: self-attention against recurrent and convolutional layers.

The paper's claim (§4, Table 1), per layer, for sequence length n, width d, kernel k, window r:
    layer                        complexity      sequential operations   maximum path length
    self-attention               O(n^2 d)        O(1)                    O(1)
    recurrent                    O(n d^2)        O(n)                    O(n)
    convolutional                O(k n d^2)      O(1)                    O(n/k) contiguous, O(log_k n) dilated
    self-attention (restricted)  O(r n d)        O(1)                    O(n/r)
and "self-attention layers are faster than recurrent layers when the sequence length n is smaller than the
representation dimensionality d".

What this script measures, with the package's core layers at d = 64 for n = 16 .. 1024 (one sequence, float32):
- time of one forward + backward (best and median of several repeats) and its peak memory (tracemalloc: the
  bytes NumPy allocated during forward + backward above what was allocated before, the saved activations
  included), beside each layer's formula, its constant fitted to the measurements at the larger n;
- sequential operations: the longest chain of array operations in one forward, each waiting for the last
  (experiments/tracking.py);
- maximum path length: L layers of one kind stacked; the smallest L for which d out_n / d x_1 is not zero
  (an exact zero means no path). The recurrent layer's path runs inside one layer, through its n - 1 steps;
- the gradient's size across the whole sequence, |d out_n / d x_1|, in one recurrent and one multi-head
  self-attention layer (a short path is one thing; a gradient that survives it is what learning needs);
- where self-attention stops being cheaper than the recurrent and convolutional layers (the n < d crossover),
  in time measured and in multiply-adds counted, at d = 64 and again for d = 32 .. 512, so that the crossover's
  movement with d is measured, not assumed.
Restricted self-attention is measured twice: the core's band mask (mt.masks.local_mask, which still computes
the whole n x n grid) and a banded layer that computes only the band (experiments/models.py).

    python experiments/table1.py            # under a minute on 2 CPU cores
    python experiments/table1.py --quick    # seconds
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
import tracemalloc

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
from models import BandedAttention, MultiHeadSelfAttention, SelfAttention
from tracking import sequential_operations

import minitransformer as mt
from minitransformer import layers as L

NAME = "table1"
KINDS = {   # key: (label, Table 1's complexity, its maximum path length)
    "self_attention": ("self-attention", "n^2 d", "1"),
    "multi_head": ("multi-head self-attention (+ projections)", "n^2 d + 4 n d^2", "1"),
    "recurrent": ("recurrent (Elman RNN)", "n d^2", "n"),
    "convolution": ("convolutional (k=3)", "k n d^2", "n/k"),
    "restricted_mask": ("restricted, band mask on the n x n grid", "r n d", "n/r"),
    "restricted_banded": ("restricted, band only", "r n d", "n/r"),
}


def make_layer(kind: str, d: int, n: int, s):
    """The layer, and the extra forward arguments (a mask) it takes at length n."""
    if kind == "self_attention":
        return SelfAttention(L.ScaledDotProductAttention()), ()
    if kind == "multi_head":
        return MultiHeadSelfAttention(d, s["heads"]), ()
    if kind == "recurrent":
        return L.RNN(d), ()
    if kind == "convolution":
        return L.Conv1d(d, s["kernel"]), ()
    if kind == "restricted_mask":
        return SelfAttention(L.ScaledDotProductAttention()), (mt.masks.local_mask(n, s["r"]),)
    if kind == "restricted_banded":
        return SelfAttention(BandedAttention(s["r"])), ()
    raise ValueError(kind)


def multiply_adds(kind: str, n: int, d: int, s) -> int:
    """The forward's multiply-adds, counted from the code: what each formula of Table 1 abbreviates."""
    k, r = s["kernel"], s["r"]
    return {"self_attention": 2 * n * n * d,                  # Q K^T and weights V
            "multi_head": 2 * n * n * d + 4 * n * d * d,     # + the four projections
            "recurrent": 2 * n * d * d,                      # x_t W_x and h_{t-1} W_h at each step
            "convolution": k * n * d * d,
            "restricted_mask": 2 * n * n * d,                # the mask does not make the grid smaller
            "restricted_banded": 2 * (2 * r + 1) * n * d}[kind]


def formula(kind: str, n, d: int, s):
    """Table 1's complexity, up to its constant."""
    k, r = s["kernel"], s["r"]
    n = numpy.asarray(n, dtype=float)
    return {"self_attention": n * n * d, "multi_head": n * n * d + 4 * n * d * d, "recurrent": n * d * d,
            "convolution": k * n * d * d, "restricted_mask": r * n * d, "restricted_banded": r * n * d}[kind]


@contextlib.contextmanager
def float64():
    """Build in float64 (exact zeros stay zeros, tiny gradients do not underflow), then restore the default."""
    before = mt.get_default_dtype()
    mt.set_default_dtype("float64")
    try:
        yield
    finally:
        mt.set_default_dtype(before)


def forward_backward(layer, x, extra, dout):
    layer.forward(x, *extra)
    layer.backward(dout)


def time_and_memory(kind: str, n: int, s, rng) -> dict:
    d = s["d"]
    mt.manual_seed(0)
    layer, extra = make_layer(kind, d, n, s)
    x = rng.standard_normal((s["batch"], n, d)).astype(numpy.float32)       # (B,n,d)
    dout = rng.standard_normal((s["batch"], n, d)).astype(numpy.float32)    # (B,n,d)
    forward_backward(layer, x, extra, dout)                                 # warm-up
    times = []
    budget_end = time.perf_counter() + s["seconds_per_point"]
    while len(times) < s["repeats"] or (time.perf_counter() < budget_end and len(times) < 50):
        t0 = time.perf_counter()
        forward_backward(layer, x, extra, dout)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    forward_backward(layer, x, extra, dout)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {"best_ms": 1e3 * min(times), "median_ms": 1e3 * float(numpy.median(times)), "repeats": len(times),
            "peak_bytes": int(peak), "multiply_adds": multiply_adds(kind, n, d, s)}


def path_length(kind: str, n: int, s, rng):
    """Stack layers of one kind; the smallest count L for which d out_n / d x_1 != 0 (None: more than stacked).

    One forward through L_max layers, then one backward from position n alone: the gradient at the input of
    the L-th layer from the top is what a stack of L layers would give, so one pass measures every L."""
    d = s["path_d"]
    reach = {"convolution": s["kernel"] // 2, "restricted_mask": s["r"], "restricted_banded": s["r"]}.get(kind)
    most = 2 if reach is None else math.ceil((n - 1) / reach) + 1    # a layer more than the formula needs
    with float64():                                                  # an exact zero, not float32 underflow
        mt.manual_seed(1)
        stack = [make_layer(kind, d, n, s) for _ in range(most)]
        h = rng.standard_normal((1, n, d))                           # (1,n,d)
        for layer, extra in stack:
            h = layer.forward(h, *extra)
        g = numpy.zeros((1, n, d))
        g[0, n - 1] = rng.standard_normal(d)                         # d out_n only
        for count, (layer, _) in enumerate(reversed(stack), start=1):
            g = layer.backward(g)
            if numpy.any(g[0, 0] != 0):
                return count
        return None


def recurrent_steps_on_path(n: int, s, rng) -> int:
    """Within one recurrent layer: the sequential operations from reading x_1 to writing out_n, in steps.
    The chain grows by a fixed number of operations per position; out_n ends it and x_1 enters at its start."""
    d = s["path_d"]
    depth = {t: sequential_operations(L.RNN(d), rng.standard_normal((1, t, d))) for t in (1, 2, n)}
    per_step = depth[2] - depth[1]
    return (depth[n] - depth[1]) // per_step


GRADIENT_DRAWS = 5


def gradient_across(kind: str, n: int, s, rng, draws: int = GRADIENT_DRAWS) -> float:
    """|d out_n / d x_1| for a random unit direction at out_n, in one layer at width d; the mean of a few draws
    (inputs, weights and direction drawn anew each time)."""
    d = s["d"]
    with float64():
        sizes = []
        for draw in range(draws):
            mt.manual_seed(2 + draw)
            layer, extra = make_layer(kind, d, n, s)
            layer.forward(rng.standard_normal((1, n, d)), *extra)
            g = numpy.zeros((1, n, d))
            u = rng.standard_normal(d)
            g[0, n - 1] = u / numpy.linalg.norm(u)
            sizes.append(float(numpy.linalg.norm(layer.backward(g)[0, 0])))
        return float(numpy.mean(sizes))


def crossover(ns, a, b):
    """The n where series a (growing faster) overtakes b, interpolated on log n; None if it does not in range."""
    ratio = numpy.log(numpy.asarray(a, dtype=float) / numpy.asarray(b, dtype=float))
    for i in range(1, len(ns)):
        if ratio[i - 1] < 0 <= ratio[i]:
            f = -ratio[i - 1] / (ratio[i] - ratio[i - 1])
            return float(math.exp(math.log(ns[i - 1]) + f * (math.log(ns[i]) - math.log(ns[i - 1]))))
    return None if ratio[-1] < 0 else (float(ns[0]) if ratio[0] >= 0 else None)


CROSSOVER_KINDS = ("self_attention", "recurrent", "convolution")


SHORT = {"self_attention": "self-attention", "multi_head": "multi-head", "recurrent": "recurrent",
         "convolution": "convolution", "restricted_mask": "band mask", "restricted_banded": "band only"}


def growth(values: list, ns: list) -> float:
    """The exponent e of values ~ n^e, read off the last two doublings of the range (n/4 to n), where each layer's
    leading term dominates its fixed costs."""
    return math.log(values[-1] / values[-3]) / math.log(ns[-1] / ns[-3])


def _order(e: float) -> str:
    """An exponent as the power of n it rounds to, the rule by which a measured growth matches a formula."""
    return {0: "O(1)", 1: "O(n)", 2: "O(n^2)"}.get(round(e), f"O(n^{round(e)})")


def claims(res: dict, s: dict) -> list:
    """Table 1's claims, each with what was measured and a verdict derived from the stored numbers alone.

    Growth: an exponent matches a formula's power of n when it rounds to it (time and memory both). Counts
    (sequential operations, path lengths) must equal the formula at every n measured. The n < d crossover: the
    count must fall at n = d (within 1%); the time at n within a factor 2 of d."""
    ns, k, r, d = s["ns"], s["kernel"], s["r"], s["d"]
    pns = s["path_ns"]
    cost = {kind: [res["cost"][kind][str(n)] for n in ns] for kind in KINDS}
    exps = {kind: (growth([c["best_ms"] for c in cost[kind]], ns), growth([c["peak_bytes"] for c in cost[kind]], ns))
            for kind in KINDS}
    span = f"from n = {ns[-3]} to {ns[-1]}"
    out = []

    def matches(kind, power):
        return all(round(e) == power for e in exps[kind])

    def off(kind, power):
        """How a layer's growth misses the formula: the order of each exponent that does not round to it."""
        return ", ".join(f"{_order(e)} in {what}" for e, what in zip(exps[kind], ("time", "memory"))
                         if round(e) != power)

    def growth_text(kind):
        return f"time n^{exps[kind][0]:.2f}, memory n^{exps[kind][1]:.2f}"

    for claim, kind, power in (("self-attention costs O(n^2 d)", "self_attention", 2),
                               ("recurrent costs O(n d^2)", "recurrent", 1),
                               ("convolution costs O(k n d^2)", "convolution", 1)):
        out.append({"claim": claim, "measured": f"{growth_text(kind)} {span}",
                    "verdict": "yes" if matches(kind, power) else f"no ({off(kind, power)})"})
    mask, banded = matches("restricted_mask", 1), matches("restricted_banded", 1)
    verdict = ("yes" if mask and banded else
               f"only when the band alone is computed (the band mask on the n x n grid: {off('restricted_mask', 1)})"
               if banded else f"no (the band alone: {off('restricted_banded', 1)})")
    out.append({"claim": "restricted self-attention costs O(r n d)",
                "measured": f"with the band mask: {growth_text('restricted_mask')}; computing the band only: "
                            f"{growth_text('restricted_banded')}", "verdict": verdict})

    seq = {kind: [res["sequential_operations"][kind][str(n)] for n in ns] for kind in KINDS}

    def constant(kinds):
        return all(len(set(seq[kind])) == 1 for kind in kinds)

    def at_every_n(kinds):
        return ", ".join(f"{SHORT[kind]} {seq[kind][0]}" if len(set(seq[kind])) == 1 else
                         f"{SHORT[kind]} {seq[kind][0]} .. {seq[kind][-1]}" for kind in kinds)

    out.append({"claim": "self-attention: O(1) sequential operations",
                "measured": f"{at_every_n(['self_attention', 'multi_head'])}, at every n",
                "verdict": "yes" if constant(["self_attention", "multi_head"]) else "no"})
    per_n = {x / n for x, n in zip(seq["recurrent"], ns)}                # one value: proportional to n
    out.append({"claim": "recurrent: O(n) sequential operations",
                "measured": (f"{min(per_n):g} n exactly" if len(per_n) == 1 else "not proportional to n")
                + f" ({seq['recurrent'][0]} at n = {ns[0]}, {seq['recurrent'][-1]} at n = {ns[-1]})",
                "verdict": "yes" if len(per_n) == 1 else "no"})
    kinds = ["convolution", "restricted_mask", "restricted_banded"]
    out.append({"claim": "convolution, restricted: O(1) sequential operations",
                "measured": f"{at_every_n(kinds)}, at every n", "verdict": "yes" if constant(kinds) else "no"})

    path = {kind: {n: res["path_length_layers"][kind][str(n)] for n in pns} for kind in KINDS}
    steps = {n: res["recurrent_steps_on_path"][str(n)] for n in pns}
    ones = all(path[kind][n] == 1 for kind in ("self_attention", "multi_head") for n in pns)
    out.append({"claim": "self-attention: maximum path length O(1)",
                "measured": "1 layer at every n (multi-head too)" if ones else "more than 1 layer at some n",
                "verdict": "yes" if ones else "no"})
    rec = all(path["recurrent"][n] == 1 and steps[n] == n - 1 for n in pns)
    out.append({"claim": "recurrent: maximum path length O(n)",
                "measured": ("1 layer, through n - 1 recurrent steps at every n" if rec else
                             f"steps: {', '.join(str(steps[n]) for n in pns)} for n = {pns[0]} .. {pns[-1]}"),
                "verdict": "yes" if rec else "no"})
    conv = [path["convolution"][n] for n in pns]
    ok = conv == [math.ceil((n - 1) / (k // 2)) for n in pns]
    out.append({"claim": "convolution: O(n/k) layers (contiguous kernels)",
                "measured": f"{conv[0]} .. {conv[-1]} layers for n = {pns[0]} .. {pns[-1]}: "
                            f"ceil((n - 1) / {k // 2}){' at every n' if ok else ' not at every n'}, each layer "
                            f"reaching floor(k/2) = {k // 2} further",
                "verdict": "yes (O(log_k n) for dilated kernels: not run)" if ok else "no"})
    band = [path["restricted_banded"][n] for n in pns]
    both = [n for n in pns if path["restricted_mask"][n] is not None]
    ok = (band == [math.ceil((n - 1) / r) for n in pns]
          and all(path["restricted_mask"][n] == path["restricted_banded"][n] for n in both))
    out.append({"claim": "restricted: maximum path length O(n/r)",
                "measured": f"{', '.join(str(x) for x in band)} layers for n = {pns[0]} .. {pns[-1]} (r = {r}; the "
                            + (f"band mask to n = {both[-1]}" if both else "band mask not run")
                            + f", the band alone to {pns[-1]})",
                "verdict": "yes: ceil((n - 1) / r) at every n, both layers alike" if ok else "no"})

    c = res["crossover"]
    counted, timed = c["multiply_adds_self_attention_vs_recurrent_n"], c["time_self_attention_vs_recurrent_n"]
    where = (f"at n = {timed:.0f}" if timed is not None else
             f"never up to n = {ns[-1]} ({cost['self_attention'][-1]['best_ms']:.3g} ms against "
             f"{cost['recurrent'][-1]['best_ms']:.3g} ms at n = {ns[-1]})")
    out.append({"claim": '"self-attention layers are faster than recurrent layers when n < d"',
                "measured": f"counted in multiply-adds, the crossover is {at_n(counted, ns)} (d = {d}); measured in "
                            f"time, {where}; the multi-head layer with its projections "
                            f"{at_n(c['time_multi_head_vs_recurrent_n'], ns)}",
                "verdict": ("the count by construction (its multiply-add formulas are written in, not measured)"
                            if _near(counted, d, 1.01) else "the count no") + "; in time "
                           f"{'yes' if _near(timed, d, 2.0) else 'no'} on this CPU"})
    return out


def _near(x, target, factor: float) -> bool:
    """Whether a crossover x lies within a factor of target (a crossover beyond the range, None, never does)."""
    return x is not None and target is not None and target / factor <= x <= target * factor


def at_n(x, ns) -> str:
    """Where a crossover lies, in words: at its n, or beyond the measured range (None)."""
    return f"at n = {x:.0f}" if x is not None else f"beyond the range (n <= {ns[-1]})"


def crossover_by_d(s, rng, bar=None) -> dict:
    """For each width d of crossover_ds: the time of each layer of CROSSOVER_KINDS at every n of crossover_ns,
    its multiply-adds, and the n at which self-attention stops being cheaper than the recurrent and the
    convolutional layer, in time and in multiply-adds. Table 1 puts that n near d: it should move with d."""
    ns, out = s["crossover_ns"], {}
    for d in s["crossover_ds"]:
        sd = dict(s, d=d)
        best = {k: [time_and_memory(k, n, sd, rng)["best_ms"] for n in ns] for k in CROSSOVER_KINDS}
        flops = {k: [multiply_adds(k, n, d, sd) for n in ns] for k in CROSSOVER_KINDS}
        out[str(d)] = {"best_ms": best, "multiply_adds": flops, **{
            f"{what}_self_attention_vs_{other}_n": crossover(ns, series["self_attention"], series[other])
            for what, series in (("time", best), ("multiply_adds", flops)) for other in ("recurrent", "convolution")}}
        if bar is not None:
            bar.update()
    return out


def claims_by_d(by_d: dict, s: dict) -> list:
    """Does the n < d crossover move with d? For each width: the count against the recurrent layer must fall at
    n = d (within 1%); the time counts as "at the count" within a factor 2 of it."""
    ns, ds = s["crossover_ns"], list(by_d)

    def where(key):
        return ", ".join(f"{'beyond ' + str(ns[-1]) if by_d[d][key] is None else f'{by_d[d][key]:.0f}'} at d = {d}"
                         for d in ds)

    out = []
    counted = all(_near(by_d[d]["multiply_adds_self_attention_vs_recurrent_n"], int(d), 1.01) for d in ds)
    out.append({"claim": "counted in multiply-adds, self-attention is cheaper than the recurrent layer when n < d",
                "measured": f"the crossover: {where('multiply_adds_self_attention_vs_recurrent_n')}",
                "verdict": "by construction, at every d (the multiply-add formulas are written in, not measured)"
                           if counted else "no"})
    timed = [by_d[d]["time_self_attention_vs_recurrent_n"] for d in ds]
    at_d = all(_near(x, int(d), 2.0) for x, d in zip(timed, ds))
    # A crossover beyond the range lies above every one inside it, so the Nones must come last.
    seen = [x for x in timed if x is not None]
    rising = bool(seen) and timed[:len(seen)] == seen and all(a < b for a, b in itertools.pairwise(seen))
    far_above = all(x is None or x > 2 * int(d) for x, d in zip(timed, ds))
    out.append({"claim": "in time, the same crossover, at n = d",
                "measured": f"the crossover: {where('time_self_attention_vs_recurrent_n')}",
                "verdict": "yes, within a factor 2 at every d" if at_d else
                           "no: it moves up with d, but far above n = d" if rising and far_above else "no"})
    conv = all(_near(by_d[d]["time_self_attention_vs_convolution_n"],
                     by_d[d]["multiply_adds_self_attention_vs_convolution_n"], 2.0) for d in ds)
    out.append({"claim": "in time, against the convolution, where the count puts it (n = 3d/2)",
                "measured": f"the crossover: {where('time_self_attention_vs_convolution_n')}",
                "verdict": "yes, within a factor 2 at every d" if conv else "no"})
    return out


def derived(results: dict, s: dict) -> dict:
    """The results with the verdicts that follow from their numbers: the claims, and those against d if measured."""
    out = {**results, "claims": claims(results, s)}
    if "crossover_by_d" in results:
        out["claims_by_d"] = claims_by_d(results["crossover_by_d"], s)
    return out


def run(s, progress=True) -> dict:
    rng = numpy.random.default_rng(0)
    ns, path_ns = s["ns"], s["path_ns"]
    jobs = len(KINDS) * len(ns) + len(KINDS) * len(path_ns) + 2 * len(ns) + len(s["crossover_ds"])
    bar = common.progress(jobs, "table 1", disable=not progress)
    cost = {k: {} for k in KINDS}
    for n in ns:
        for kind in KINDS:
            cost[kind][n] = time_and_memory(kind, n, s, rng)
            bar.update()
    seq = {k: {} for k in KINDS}
    for n in ns:
        for kind in KINDS:
            layer, extra = make_layer(kind, s["d"], n, s)
            seq[kind][n] = sequential_operations(layer, rng.standard_normal((1, n, s["d"])).astype(numpy.float32),
                                                 *extra)
        bar.update()
    path = {k: {} for k in KINDS}
    for n in path_ns:
        for kind in KINDS:
            if kind == "restricted_mask" and n > s["path_mask_max_n"]:
                path[kind][n] = None         # the dense grid's stack outgrows memory; the banded twin stands in
            else:
                path[kind][n] = path_length(kind, n, s, rng)
            bar.update()
    steps = {n: recurrent_steps_on_path(n, s, rng) for n in path_ns}
    across = {kind: {n: gradient_across(kind, n, s, rng) for n in ns} for kind in ("recurrent", "multi_head")}
    bar.update(len(ns))

    by_d = crossover_by_d(s, rng, bar)
    bar.close()

    best = {k: [cost[k][n]["best_ms"] for n in ns] for k in KINDS}
    flops = {k: [cost[k][n]["multiply_adds"] for n in ns] for k in KINDS}
    d = s["d"]
    results = {
        "cost": {k: {str(n): v for n, v in cost[k].items()} for k in KINDS},
        "sequential_operations": {k: {str(n): v for n, v in seq[k].items()} for k in KINDS},
        "path_length_layers": {k: {str(n): v for n, v in path[k].items()} for k in KINDS},
        "recurrent_steps_on_path": {str(n): v for n, v in steps.items()},
        "gradient_first_to_last": {k: {str(n): v for n, v in across[k].items()} for k in across},
        "crossover": {
            "d": d,
            "time_self_attention_vs_recurrent_n": crossover(ns, best["self_attention"], best["recurrent"]),
            "time_self_attention_vs_convolution_n": crossover(ns, best["self_attention"], best["convolution"]),
            "time_multi_head_vs_recurrent_n": crossover(ns, best["multi_head"], best["recurrent"]),
            "multiply_adds_self_attention_vs_recurrent_n": crossover(ns, flops["self_attention"], flops["recurrent"]),
            "multiply_adds_self_attention_vs_convolution_n": crossover(ns, flops["self_attention"],
                                                                       flops["convolution"]),
        },
        "crossover_by_d": by_d,
        "labels": {k: v[0] for k, v in KINDS.items()},
        "formulas": {k: {"complexity": v[1], "path": v[2]} for k, v in KINDS.items()},
    }
    return derived(results, s)


def figures(payload) -> dict:
    """Time, memory, sequential operations and path length against n, each beside the paper's formula."""
    s, res = payload["settings"], payload["results"]
    ns = numpy.array(s["ns"])
    d, out = s["d"], {}
    colors = dict(zip(KINDS, ["C0", "C4", "C1", "C2", "C3", "C5"]))

    fig, (ax_t, ax_m) = common.new_figure(2, width=6.0, height=4.4)
    for kind, (label, law, _) in KINDS.items():
        t = numpy.array([res["cost"][kind][str(n)]["best_ms"] for n in ns])
        m = numpy.array([res["cost"][kind][str(n)]["peak_bytes"] for n in ns]) / 2 ** 20
        ax_t.plot(ns, t, "o-", color=colors[kind], label=label)
        f = formula(kind, ns, d, s)
        upper = ns >= numpy.median(ns)                 # fit the constant where the formula's term dominates
        ax_t.plot(ns, f * numpy.exp(numpy.mean(numpy.log(t[upper] / f[upper]))), ":", color=colors[kind], alpha=0.8)
        ax_m.plot(ns, m, "o-", color=colors[kind], label=label)
    ax_t.axvline(d, color="grey", lw=0.8)
    ax_t.text(d, ax_t.get_ylim()[1], " n = d", va="top", color="grey")
    ax_t.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="forward + backward, ms (best)",
             title=f"Time per layer, d = {d} (dotted: Table 1's formula, fitted)")
    ax_m.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="peak MiB (tracemalloc)",
             title="Peak memory of forward + backward")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3, which="both")
    ax_t.legend(fontsize=7)
    out["time_memory"] = fig

    fig, (ax_s, ax_p, ax_g) = common.new_figure(3, width=4.6, height=4.0)
    for kind, (label, _, _) in KINDS.items():
        seq = [res["sequential_operations"][kind][str(n)] for n in ns]
        ax_s.plot(ns, seq, "o-", color=colors[kind], label=label)
    rec = res["sequential_operations"]["recurrent"][str(ns[-1])]
    ax_s.plot(ns, rec * ns / ns[-1], ":", color="grey", label="proportional to n")
    ax_s.set(xscale="log", yscale="log", xlabel="n", ylabel="operations in the longest chain",
             title="Sequential operations (one forward)")
    pns = numpy.array(s["path_ns"])
    markers = dict(zip(KINDS, "osDx^v"))
    for kind, (label, _, _) in KINDS.items():
        if kind == "recurrent":
            ys = [res["recurrent_steps_on_path"][str(n)] for n in pns]
            label = "recurrent: steps inside 1 layer"
        else:
            ys = [res["path_length_layers"][kind][str(n)] for n in pns]
        xs = [n for n, y in zip(pns, ys) if y is not None]
        ax_p.plot(xs, [y for y in ys if y is not None], markers[kind], color=colors[kind], label=label, alpha=0.8,
                  mfc="none")
    k, r = s["kernel"], s["r"]
    ax_p.plot(pns, pns - 1, ":", color=colors["recurrent"], label="n - 1")
    ax_p.plot(pns, numpy.ceil((pns - 1) / (k // 2)), ":", color=colors["convolution"], label="(n-1) / (k//2)")
    ax_p.plot(pns, numpy.ceil((pns - 1) / r), ":", color=colors["restricted_banded"], label="(n-1) / r")
    ax_p.plot(pns, numpy.ceil(numpy.log(pns) / numpy.log(k)), ":", color="grey", label="log_k n (dilated, not run)")
    ax_p.set(xscale="log", yscale="log", xlabel="n", ylabel="layers (steps for the RNN)",
             title="Maximum path length, x_1 to out_n")
    ax_p.legend(fontsize=7)
    for kind in ("recurrent", "multi_head"):
        g = numpy.array([res["gradient_first_to_last"][kind][str(n)] for n in ns])
        ax_g.plot(ns[g > 0], g[g > 0], "o-", color=colors[kind], label=KINDS[kind][0])   # 0: underflow
    ax_g.plot(ns, 1.0 / ns, ":", color="grey", label="1/n")
    ax_g.set(xscale="log", yscale="log", xlabel="n", ylabel="|d out_n / d x_1|",
             title="Gradient across the sequence, 1 layer")
    ax_g.legend(fontsize=7)
    for ax in (ax_s, ax_p, ax_g):
        ax.grid(alpha=0.3, which="both")
    ax_s.legend(fontsize=7)
    out["sequential_path"] = fig

    fig, (ax,) = common.new_figure(1, width=6.0, height=4.0)
    for other in ("recurrent", "convolution"):
        t = [res["cost"]["self_attention"][str(n)]["best_ms"] / res["cost"][other][str(n)]["best_ms"] for n in ns]
        f = [res["cost"]["self_attention"][str(n)]["multiply_adds"] / res["cost"][other][str(n)]["multiply_adds"]
             for n in ns]
        ax.plot(ns, t, "o-", color=colors[other], label=f"time: self-attention / {KINDS[other][0]}")
        ax.plot(ns, f, ":", color=colors[other], label=f"multiply-adds: self-attention / {other}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axvline(d, color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="ratio (< 1: self-attention cheaper)",
           title=f"The n < d crossover (d = {d})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    out["crossover"] = fig

    if "crossover_by_d" in res:
        fig, (ax,) = common.new_figure(1, width=5.0, height=4.0)
        ds = numpy.array([int(d) for d in res["crossover_by_d"]])
        for other, colour in (("recurrent", colors["recurrent"]), ("convolution", colors["convolution"])):
            for what, style in (("time", "o-"), ("multiply_adds", "s:")):
                n = [res["crossover_by_d"][str(d)][f"{what}_self_attention_vs_{other}_n"] for d in ds]
                keep = [x is not None for x in n]
                ax.plot(ds[keep], [x for x in n if x is not None], style, color=colour,
                        label=f"{what.replace('_', '-')}: self-attention = {other}")
        ax.plot(ds, ds, color="grey", lw=0.8, label="n = d")
        ax.set(xscale="log", yscale="log", xlabel="width d", ylabel="crossover length n",
               title="Where self-attention stops being cheaper")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        out["crossover_by_d"] = fig
    return out


PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]
QUICK = dict(SETTINGS, ns=[16, 32, 64], repeats=2, seconds_per_point=0.0, path_ns=[16, 32], r=4,
             crossover_ds=[16, 32], crossover_ns=[8, 16, 32, 64])


if __name__ == "__main__":
    common.main(sys.modules[__name__])
