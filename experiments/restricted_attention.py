"""Restricted self-attention, trained: a window of radius r in each of L layers reaches r*L positions, no farther.

The paper's claim (§4, Table 1): restricting self-attention "to considering only a neighborhood of size r in
the input sequence centered around the respective output position [...] would increase the maximum path
length to O(n/r)". So with L layers, information travels at most r*L positions: a task whose answer at
position i sits farther than r*L away cannot be learned, one whose answer is near can.

What this script measures: an encoder-only model (learned positions, L post-LN encoder layers of the core
with the band mask mt.masks.local_mask(n, r), a linear read-out per position) trained on
    copy     output i = input i          (distance 0: reachable with any window)
    reverse  output i = input n-1-i      (distance |n-1-2i|, up to n-1 = 15 at n = 16)
for windows r and depths L with r*L from 1 to 16; the held-out accuracy, overall and per position, against
the bound the path length sets: a position is learnable only if its source lies within r*L, and otherwise
guessed at chance, 1 / (number of symbols). Every (task, r, L) trains 5 seeds (each seed its own initial
weights and batches); every run is set against the bound, and the summary gives each config's mean, SD and
range over the seeds and its largest excess over the bound.

    python experiments/restricted_attention.py            # about 6 minutes on 2 CPU cores
    python experiments/restricted_attention.py --quick    # seconds
"""

from __future__ import annotations

import math
import sys
import time

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import training
from models import Tagger

import minitransformer as mt

NAME = "restricted_attention"
PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]                 # configs: [r, L]
QUICK = dict(SETTINGS, n=8, steps=30, eval_every=10, eval_examples=64, seeds=[0, 1], configs=[[1, 1], [2, 2], [7, 1]])


def make_batch(rng, task: str, batch: int, n: int, symbols: int):
    """Random symbols 1..symbols (0 is padding, unused), and the target: the same, or reversed."""
    x = rng.integers(1, symbols + 1, size=(batch, n))          # (B,n)
    return x, (x if task == "copy" else x[:, ::-1].copy())


def source_distance(task: str, n: int):
    """How far each output position's answer sits from it.   (n,)"""
    i = numpy.arange(n)
    return numpy.zeros(n, dtype=int) if task == "copy" else numpy.abs(n - 1 - 2 * i)


def bound(task: str, n: int, reach: int, symbols: int):
    """Per position: 1 where the source is within reach, chance elsewhere.   (n,)"""
    return numpy.where(source_distance(task, n) <= reach, 1.0, 1.0 / symbols)


def train(task: str, r: int, layers: int, seed: int, s: dict, bar=None) -> dict:
    """Train one (task, r, L, seed); its held-out accuracy curve, per position at the end, and the bound."""
    n = s["n"]
    mt.manual_seed(seed)
    model = Tagger(s["symbols"] + 1, n, s["d_model"], s["num_heads"], s["d_ff"], layers)
    opt = mt.optim.Adam(model.parameters(), lr=s["lr"])
    loss_fn = mt.CrossEntropyLoss(ignore_index=0)
    mask = mt.masks.local_mask(n, r)                            # (1,1,n,n): |i - j| <= r
    data = numpy.random.default_rng(seed)
    held_out = make_batch(numpy.random.default_rng(10_000), task, s["eval_examples"], n, s["symbols"])
    curve = {"step": [], "accuracy": [], "loss": []}
    per_position = None
    seconds = 0.0
    for step in range(1, s["steps"] + 1):
        x, y = make_batch(data, task, s["batch"], n, s["symbols"])
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x, mask), y)
        model.backward(loss_fn.backward())
        opt.step()
        seconds += time.perf_counter() - t0
        if step % s["eval_every"] == 0 or step == s["steps"]:
            model.eval()
            logits = model(held_out[0], mask)                   # (E,n,V)
            right = logits.argmax(axis=-1) == held_out[1]       # (E,n)
            per_position = right.mean(axis=0)
            curve["step"].append(step)
            curve["accuracy"].append(float(right.mean()))
            curve["loss"].append(loss_fn(logits, held_out[1]))
            model.train()
        if bar is not None:
            bar.update()
    b = bound(task, n, r * layers, s["symbols"])
    return {"task": task, "r": r, "layers": layers, "reach": r * layers, "seed": seed, **curve,
            "final_accuracy": curve["accuracy"][-1], "per_position": per_position.tolist(),
            "bound_per_position": b.tolist(), "bound": float(b.mean()), "ms_per_step": 1e3 * seconds / s["steps"]}


def run_one(job: tuple) -> dict:
    return train(*job)


def run(s, progress=True) -> dict:
    jobs = [(task, r, layers, seed, s) for task in s["tasks"] for r, layers in s["configs"] for seed in s["seeds"]]
    with common.progress(len(jobs), "restricted attention runs", disable=not progress) as bar:
        runs = training.run_many(run_one, jobs, bar)
    return summarize(runs, s)


def summarize(runs: list, s: dict) -> dict:
    """Per (task, r, L): the accuracy over seeds against the bound; for reverse within less than the needed
    reach, the accuracy per position inside and outside the reach (mean over seeds); from the runs alone."""
    n = s["n"]
    configs = {}
    for task in s["tasks"]:
        for r, layers in s["configs"]:
            mine = [x for x in runs if (x["task"], x["r"], x["layers"]) == (task, r, layers)]
            acc = [x["final_accuracy"] for x in mine]
            pos = numpy.mean([x["per_position"] for x in mine], axis=0)              # (n,)
            within = numpy.array(mine[0]["bound_per_position"]) == 1.0               # (n,)
            configs[f"{task}/{r}/{layers}"] = {
                "task": task, "r": r, "layers": layers, "reach": r * layers, "bound": mine[0]["bound"],
                "seeds": [x["seed"] for x in mine], "accuracy": common.summary(acc), "per_seed": acc,
                "largest_excess": max(a - mine[0]["bound"] for a in acc),
                "per_position_mean": pos.tolist(),
                "within_reach": common.summary(pos[within]) if within.any() else None,
                "beyond_reach": common.summary(pos[~within]) if (~within).any() else None}
    rev = [x for x in runs if x["task"] == "reverse"]
    # Reverse needs a reach of n - 1; below it, the measured accuracy should sit on the bound, not above.
    return {"runs": runs, "configs": configs, "reach_needed": {"reverse": n - 1, "copy": 0},
            "largest_excess_over_bound": max((x["final_accuracy"] - x["bound"] for x in runs), default=None),
            "reverse_short_reach_mean_accuracy": _mean([x["final_accuracy"] for x in rev if x["reach"] < n - 1]),
            "reverse_full_reach_mean_accuracy": _mean([x["final_accuracy"] for x in rev if x["reach"] >= n - 1]),
            "copy_mean_accuracy": _mean([x["final_accuracy"] for x in runs if x["task"] == "copy"]),
            "claims": claims(runs, configs, s)}


LEARNED = 0.9        # a position "learned": at least this accuracy (chance is 1/symbols)
SIGMAS = 4           # a run "above its bound": by more than this many standard errors of chance guessing


def excess_beyond_reach(run: dict, s: dict) -> float:
    """What the positions beyond a run's reach add to its accuracy above chance guessing (their share of it)."""
    chance = 1.0 / s["symbols"]
    return sum(a - chance for a, b in zip(run["per_position"], run["bound_per_position"]) if b < 1.0) / s["n"]


def excess_allowed(run: dict, s: dict) -> float:
    """How far excess_beyond_reach may go by sampling alone: SIGMAS standard errors of the same share when every
    position beyond the reach is a chance guess, over eval_examples held-out sequences."""
    p, beyond = 1.0 / s["symbols"], sum(b < 1.0 for b in run["bound_per_position"])
    return SIGMAS * math.sqrt(beyond * p * (1 - p) / s["eval_examples"]) / s["n"]


NOT_RUN = {"measured": "not in this run's settings", "verdict": "not run"}


def claims(runs: list, configs: dict, s: dict) -> list:
    """§4's claims about restricted attention, each with what was measured and a verdict from the runs alone."""
    n, chance = s["n"], 1.0 / s["symbols"]
    out = [{"claim": "restricting attention to a neighbourhood of size r raises the maximum path length to O(n/r): "
                     "with L layers, information travels at most r*L", **NOT_RUN},
           {"claim": "a task within reach succeeds", **NOT_RUN},
           {"claim": "with enough reach, reverse is learnable through the window", **NOT_RUN}]
    short = [x for x in runs if x["task"] == "reverse" and x["reach"] < n - 1]
    if short:
        above = [x for x in short if excess_beyond_reach(x, s) > excess_allowed(x, s)]
        beyond = [a for x in short for a, b in zip(x["per_position"], x["bound_per_position"]) if b < 1.0]
        partial = [x for x in short if min((a for a, b in zip(x["per_position"], x["bound_per_position"])
                                            if b == 1.0), default=1.0) < LEARNED]
        out[0].update(
            measured=f"reverse with r*L < {n - 1} ({len(short)} runs): positions beyond r*L at {min(beyond):.2f} "
                     f"to {max(beyond):.2f} (chance {chance:.2f}), whose excess over chance adds at most "
                     f"{max(excess_beyond_reach(x, s) for x in short):+.3f} to a run's accuracy; {len(above)} runs "
                     f"above chance there by more than {SIGMAS} standard errors; within the reach, "
                     f"{len(short) - len(partial)} of {len(short)} runs at {LEARNED} or more at every position"
                     + "".join(f"; (r, L) = ({x['r']}, {x['layers']}) seed {x['seed']} learned only part of its "
                               f"reach ({x['final_accuracy']:.3f} against a bound of {x['bound']:.3f})"
                               for x in partial),
            verdict="yes: the bound holds for every run" if not above else f"no: {len(above)} runs pass it")
    copy = [c for c in configs.values() if c["task"] == "copy"]
    if copy:
        lowest = min(a for c in copy for a in c["per_seed"])
        out[1].update(measured=f"copy, all {len(copy)} (r, L) on every seed ({sum(len(c['per_seed']) for c in copy)} "
                               f"runs), from r*L = {min(c['reach'] for c in copy)}: the lowest accuracy {lowest:.3f}",
                      verdict="yes" if lowest >= LEARNED else "no")
    # Reach n - 2 leaves the two ends out of reach: the most a model can score without the full path.
    ceiling = float(bound("reverse", n, n - 2, s["symbols"]).mean())
    full = [c for c in configs.values() if c["task"] == "reverse" and c["reach"] >= n - 1]
    if full:
        below = [a for c in full for a in c["per_seed"] if a <= ceiling]
        out[2].update(
            measured=f"r*L >= {n - 1}: " + "; ".join(
                f"{c['accuracy']['mean']:.3f} ({c['accuracy']['min']:.3f} to {c['accuracy']['max']:.3f}) for r = "
                f"{c['r']}, L = {c['layers']}" for c in full) + f"; a reach of {n - 2} allows at most {ceiling:.3f}",
            verdict=("yes: every run above what a shorter reach allows" if not below else
                     f"yes on the mean over seeds; {len(below)} of {sum(len(c['per_seed']) for c in full)} runs not "
                     "above what a shorter reach allows" if all(c["accuracy"]["mean"] > ceiling for c in full)
                     else "no"))
    return out


def _mean(values):
    return float(numpy.mean(values)) if values else None


def figures(payload) -> dict:
    from matplotlib.patches import Rectangle

    s, res = payload["settings"], payload["results"]
    n, symbols = s["n"], s["symbols"]
    fig, (ax_a, ax_p) = common.new_figure(2, width=5.2, height=3.8)
    reaches = numpy.arange(0, n + 1)
    for i, task in enumerate(s["tasks"]):
        runs = [x for x in res["runs"] if x["task"] == task]
        ax_a.plot(reaches, [bound(task, n, q, symbols).mean() for q in reaches], "-", color=f"C{i}", alpha=0.4,
                  drawstyle="steps-post", label=f"{task}: bound from the path length")
        for layers, marker in zip(sorted({x["layers"] for x in runs}), "osD^v"):
            pts = [x for x in runs if x["layers"] == layers]
            ax_a.plot([x["reach"] for x in pts], [x["final_accuracy"] for x in pts], marker, color=f"C{i}",
                      ls="none", label=f"{task}, L = {layers}", alpha=0.8)
    ax_a.axvline(n - 1, color="grey", lw=0.8, ls=":")
    ax_a.set(xlabel="reach r * L", ylabel="held-out accuracy (per token)", ylim=(0, 1.05),
             title=f"Accuracy against r*L (n = {n})")
    ax_a.legend(fontsize=7)
    rev = sorted((c for c in res["configs"].values() if c["task"] == "reverse"), key=lambda c: (c["reach"], c["layers"]))
    grid = numpy.array([c["per_position_mean"] for c in rev])            # (configs, n)
    im = ax_p.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    for row, x in enumerate(rev):                                          # outline the reachable positions
        ok = numpy.flatnonzero(bound("reverse", n, x["reach"], symbols) == 1.0)
        if len(ok):
            ax_p.add_patch(Rectangle((ok[0] - 0.5, row - 0.5), len(ok), 1, fill=False, ec="w", lw=1))
    ax_p.set_yticks(range(len(rev)), [f"r={x['r']} L={x['layers']} (rL={x['reach']})" for x in rev], fontsize=7)
    ax_p.set(xlabel="output position i",
             title=f"Reverse: accuracy per position (boxes: within reach)\nthe mean of {len(s['seeds'])} seeds")
    fig.colorbar(im, ax=ax_p, shrink=0.8)
    ax_a.grid(alpha=0.3)
    return {"accuracy": fig}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
