"""Warmup, and where the LayerNorm sits: post-LN (the paper) against pre-LN, 6 + 6 layers.

The paper puts each LayerNorm after the residual sum, LayerNorm(x + Sublayer(x)) (§3.1), and trains with a
learning rate that warms up linearly over 4000 steps before decaying (§5.3). Later work traced the need
for that warmup to the post-LN placement: at initialisation the gradients of a post-LN stack are largest
in its last layers, and a large early step unsettles it; with the norm moved inside the branch,
x + Sublayer(LayerNorm(x)) (pre-LN, ``norm_first``, plus one final LayerNorm per stack), the gradients are
even across layers and training needs no warmup. Measured here, on 6 encoder + 6 decoder layers of width 64
(4 heads, d_ff 128) on the copy task (batches of 64 random strings of 1..10 symbols, `train --task copy`'s
data, loss, Adam and clipping at norm 1):

1. the gradient norm of each layer's parameters at initialisation, post-LN and pre-LN, averaged over
   4 batches and 5 seeds, for the encoder and the decoder layers;
2. a grid of rate level x warmup, warmup 1 (no warmup) included, for both, 200 steps, seeds 0..4: the
   final training loss (mean of the last 50 steps), exact match on 200 held-out strings, and each run's
   outcome: "diverged" (a NaN, or a final loss not below the first steps'), "stuck" (a final loss no lower
   than the entropy of the target tokens, what a model that ignores the source can reach: it learned the
   symbol frequencies and nothing of the copy) or "trained".

The Noam schedule (``optim.NoamSchedule``) peaks at step ``warmup`` at lr_factor * d_model^-0.5 *
warmup^-0.5. With warmup 1 the rate starts at its peak and decays as peak / sqrt(step); a longer warmup at the
same peak keeps the rate higher afterwards (peak * sqrt(warmup / step)) and over 200 steps adds up to 4 to 5 times
the total rate, so "warmup helps" would be confounded with "more learning rate helps". Under the protocol
(experiments/protocols/warmup_and_norm.json, read here, its sha256 stored with the results) a cell's rate level
is the peak of its warmup-1 schedule, and a longer warmup gets the factor whose rates over the run add up to the
same total (``lr_factor_for``, settings "match": "total"): a lower peak, the same total step budget.
Each run is stored as it finishes (resumable.py), under the protocol's hash: an interrupted study resumes.

    python experiments/warmup_and_norm.py            # about 25 minutes on one core
    python experiments/warmup_and_norm.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import resumable
import training

import minitransformer as mt
from minitransformer.kit.data.task_data import task_data
from minitransformer.kit.data.tasks import exact_match
from minitransformer.kit.running.runs import tier
from minitransformer.kit.running.trainer import NonFiniteError, unpack_batch

NAME = "warmup_and_norm"
PROTOCOL = common.protocol(NAME)
RESUMABLE = True
NORMS = {"post-LN": False, "pre-LN": True}
SOURCE = "Xiong et al. 2020"
SETTINGS = PROTOCOL["settings"]
QUICK = {"task": "copy", "model": SETTINGS["model"], "layers": 2, "grad_seeds": [0], "grad_batches": 1,
         "peaks": [3e-2], "warmups": [1, 10], "match": "total", "steps": 15, "seeds": [0, 1], "heldout": 20}


def lr_factor_for(peak: float, d_model: int, warmup: int, steps: int | None = None) -> float:
    """The Noam lr_factor whose schedule peaks (at step ``warmup``) at ``peak``; with ``steps``, the factor
    whose rates over steps 1..steps add up to the same total as the warmup-1 schedule peaking at ``peak``."""
    factor = peak * d_model ** 0.5                      # warmup 1: lr(k) = factor * d_model^-0.5 * k^-0.5
    if steps is None:
        return factor * warmup ** 0.5
    ks = numpy.arange(1, steps + 1)
    return factor * numpy.sum(ks ** -0.5) / numpy.sum(numpy.minimum(ks ** -0.5, ks * warmup ** -1.5))


def run_settings(s: dict, norm: str, **changes) -> dict:
    """The `train --task` settings of a run of this study: the task's, with the deeper model."""
    return training.settings_for(s["task"], **s["model"], num_encoder_layers=s["layers"],
                                 num_decoder_layers=s["layers"], norm_first=NORMS[norm], **changes)


def layer_grad_norms(model) -> dict:
    """The L2 norm of the gradient of each encoder and decoder layer's parameters (all of them together).
    -> {"encoder": [norm of layer 0, ...], "decoder": [...]}"""
    out = {}
    for stack in ("encoder", "decoder"):
        squares = {}
        for name, p in model.named_parameters():
            parts = name.split(".")
            if parts[0] == stack and parts[1] == "layers":
                g = mt.backend.to_numpy(p.grad).astype(numpy.float64)
                squares[int(parts[2])] = squares.get(int(parts[2]), 0.0) + float(numpy.sum(g * g))
        out[stack] = [squares[i] ** 0.5 for i in range(len(squares))]
    return out


def init_grad_norms(job: dict) -> dict:
    """Per-layer gradient norms of a freshly initialised model, one per batch of training data."""
    settings = run_settings(job["s"], job["norm"], seed=job["seed"])
    data = task_data(settings)
    mt.backend.manual_seed(job["seed"])
    Transformer, CrossEntropyLoss, _ = tier(False)
    model, loss_fn = Transformer(data.config), CrossEntropyLoss(ignore_index=data.config.pad_id)
    model.train()
    norms = []
    for batch, _ in zip(data.train_data, range(job["s"]["grad_batches"])):
        src, tgt_in, tgt_out, _ = unpack_batch(batch)
        model.zero_grad()
        loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        norms.append(layer_grad_norms(model))
    return {"norm": job["norm"], "seed": job["seed"], "per_batch": norms}


def target_entropy(batches, pad_id: int = 0) -> float:
    """The entropy (nats) of the target tokens' frequencies over ``batches``: the cross-entropy of the best
    model that ignores its input, predicting every token from the overall frequencies."""
    counts = {}
    for batch in batches:
        tgt_out = numpy.asarray(unpack_batch(batch, pad_id)[2]).ravel()
        for token, n in zip(*numpy.unique(tgt_out[tgt_out != pad_id], return_counts=True)):
            counts[int(token)] = counts.get(int(token), 0) + int(n)
    p = numpy.array(list(counts.values()), dtype=numpy.float64)
    p /= p.sum()
    return float(-(p * numpy.log(p)).sum())


def outcome(losses: list, entropy: float, start_steps: int = 5, end_steps: int = 50) -> str:
    """"diverged" (a NaN, or the final loss not below the start), "stuck" (the final loss no lower than the
    input-free ``entropy``, less a margin of 0.1 nats) or "trained". Final: the mean of the last ``end_steps``
    losses; start: the mean of the first ``start_steps``."""
    if not losses or not numpy.all(numpy.isfinite(losses)):
        return "diverged"
    start, final = numpy.mean(losses[:start_steps]), numpy.mean(losses[-end_steps:])
    if final >= start:
        return "diverged"
    return "stuck" if final >= entropy - 0.1 else "trained"


def grid_run(job: dict) -> dict:
    """Train one (norm, peak, warmup, seed) cell of the grid."""
    s = job["s"]
    steps = s["steps"] if s.get("match") == "total" else None
    settings = run_settings(s, job["norm"], seed=job["seed"], steps=s["steps"], warmup=job["warmup"],
                            lr_factor=float(lr_factor_for(job["peak"], s["model"]["d_model"], job["warmup"], steps)))
    data = task_data(settings)
    entropy = target_entropy(data.train_data.batch_at(0, k) for k in range(20))
    result = {k: job[k] for k in ("norm", "peak", "warmup", "seed")}
    try:
        (trainer, data), seconds = training.timed(training.train, settings, data)
    except NonFiniteError as err:
        return {**result, "outcome": "diverged", "nonfinite": str(err).split(".")[0], "final_loss": float("nan"),
                "exact_match": 0.0, "loss_curve": [], "entropy": entropy}
    losses = [h[1] for h in trainer.history]
    every = max(1, len(losses) // 60)
    return {**result, "outcome": outcome(losses, entropy, end_steps=min(50, len(losses))), "entropy": entropy,
            "start_loss": float(numpy.mean(losses[:5])), "final_loss": float(numpy.mean(losses[-50:])),
            "exact_match": exact_match(trainer.model, data.heldout[:s["heldout"]]),
            "loss_curve": [[k + 1, float(numpy.mean(losses[k:k + every]))] for k in range(0, len(losses), every)],
            "max_lr": max(h[2] for h in trainer.history), "train_seconds": seconds}


def run(s, progress=True, folder=None) -> dict:
    """The gradient norms and the grid, one run after another, each stored in ``folder`` as it finishes (a
    second invocation resumes; no folder: computed in parallel, one process per core, and not stored)."""
    grad_jobs = [(f"grad-{norm}-s{seed}", {"s": s, "norm": norm, "seed": seed})
                 for norm in NORMS for seed in s["grad_seeds"]]
    grid_jobs = [(f"{norm}-p{peak:g}-w{warmup}-s{seed}", {"s": s, "norm": norm, "peak": peak, "warmup": warmup,
                                                         "seed": seed})
                 for seed in s["seeds"] for norm in NORMS for peak in s["peaks"] for warmup in s["warmups"]]
    if folder is None:
        with common.progress(len(grad_jobs) + len(grid_jobs), "warmup and norm", disable=not progress) as bar:
            return summarize(training.run_many(init_grad_norms, [j for _, j in grad_jobs], bar),
                             training.run_many(grid_run, [j for _, j in grid_jobs], bar), s)
    log = print if progress else (lambda line: None)
    resumable.run_pending(grad_jobs, init_grad_norms, folder, log=log)
    resumable.run_pending(grid_jobs, grid_run, folder, log=log)
    clean = (lambda found: [{k: v for k, v in r.items() if k not in ("key", "finished")} for r in found.values()])
    return summarize(clean(resumable.collect(folder, [k for k, _ in grad_jobs])),
                     clean(resumable.collect(folder, [k for k, _ in grid_jobs])), s)


def comparisons(grid: list, s: dict) -> dict:
    """Paired by seed, each cell's exact match and final loss against another's: every warmup against none (1)
    at the same norm and peak (the claim: warmup helps), and pre-LN against post-LN at the same peak and warmup
    (the claim: pre-LN trains better, without warmup above all)."""
    import stats

    def arm(norm, peak, warmup):
        mine = [r for r in grid if (r["norm"], r["peak"], r["warmup"]) == (norm, peak, warmup)]
        return {"exact_match": {r["seed"]: r["exact_match"] for r in mine},
                "final_loss": {r["seed"]: r["final_loss"] for r in mine}}

    better = {"exact_match": (1, 0.0), "final_loss": (-1, 0.0)}
    level = "rate level" if s.get("match") == "total" else "peak"
    claim = "warmup helps at equal total rate" if s.get("match") == "total" else "warmup helps"
    source = {"source": SOURCE, **({} if s.get("match") == "total" else
                                   {"confound": "4-5x the total rate of warmup 1"})}
    out = {}
    for norm in NORMS:
        for peak in s["peaks"]:
            for warmup in s["warmups"][1:]:
                out[f"{norm}, {level} {peak:g}: warmup {warmup} - warmup 1"] = {
                    "claim": claim, "group": "warmup", "norm": norm, "peak": peak, "warmup": warmup, **source,
                    **stats.compare(arm(norm, peak, 1), arm(norm, peak, warmup), better, PROTOCOL["bounds"])}
    for peak in s["peaks"]:
        for warmup in s["warmups"]:
            out[f"{level} {peak:g}, warmup {warmup}: pre-LN - post-LN"] = {
                "claim": "pre-LN trains better", "group": "norm", "peak": peak, "warmup": warmup, "source": SOURCE,
                **stats.compare(arm("post-LN", peak, warmup), arm("pre-LN", peak, warmup), better, PROTOCOL["bounds"])}
    return stats.correct(out)


def summarize(grads: list, grid: list, s: dict) -> dict:
    """The gradient norms, the grid's cells and the comparisons, from the runs alone."""
    grad_norms = {}
    for norm in NORMS:
        for stack in ("encoder", "decoder"):
            a = numpy.array([b[stack] for g in grads if g["norm"] == norm for b in g["per_batch"]])  # (runs, layers)
            mean = a.mean(0)                                                                           # (layers,)
            grad_norms[f"{norm}/{stack}"] = {"mean": mean.tolist(), "min": a.min(0).tolist(), "max": a.max(0).tolist(),
                                             "last_over_first": float(mean[-1] / mean[0])}
    cells = {}
    for norm in NORMS:
        for peak in s["peaks"]:
            for warmup in s["warmups"]:
                mine = [r for r in grid if (r["norm"], r["peak"], r["warmup"]) == (norm, peak, warmup)]
                cells[f"{norm}/{peak:g}/{warmup}"] = {
                    "final_loss": [r["final_loss"] for r in mine], "exact_match": [r["exact_match"] for r in mine],
                    "outcomes": [r["outcome"] for r in mine]}
    return {"grad_norms": grad_norms, "grid": grid, "cells": cells, "comparisons": comparisons(grid, s)}


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    figs = {}
    fig, axes = common.new_figure(2, width=4.4, height=3.4)
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for i, norm in enumerate(NORMS):
            g = res["grad_norms"][f"{norm}/{stack}"]
            layers = numpy.arange(1, len(g["mean"]) + 1)
            ax.plot(layers, g["mean"], "o-", color=f"C{i}", label=norm)
            ax.fill_between(layers, g["min"], g["max"], color=f"C{i}", alpha=0.2, lw=0)
        ax.set(yscale="log", xlabel="layer (1 = nearest the input)", ylabel="|gradient| of the layer's parameters",
               title=f"{stack} at initialisation")
        ax.set_xticks(layers)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figs["grad_norms"] = fig

    peaks, warmups = s["peaks"], s["warmups"]
    mark = {"diverged": "X", "stuck": "-", "trained": ""}
    fig, axes = common.new_figure(2, 2, width=3.8, height=3.0)
    for row, (what, cmap, vmax) in enumerate((("final_loss", "viridis_r", None), ("exact_match", "viridis", 1.0))):
        for col, norm in enumerate(NORMS):
            ax = axes[2 * row + col]
            grid = numpy.full((len(peaks), len(warmups)), numpy.nan)
            for i, peak in enumerate(peaks):
                for j, warmup in enumerate(warmups):
                    cell = res["cells"][f"{norm}/{peak:g}/{warmup}"]
                    grid[i, j] = numpy.nanmean(cell[what]) if numpy.isfinite(cell[what]).any() else numpy.nan
                    marks = "".join(mark[o] for o in cell["outcomes"])
                    ax.text(j, i, f"{grid[i, j]:.2f}{(' ' + marks) if marks else ''}", ha="center", va="center",
                            fontsize=7, color="w" if what == "exact_match" and grid[i, j] < 0.5 else "k")
            image = ax.imshow(grid, cmap=cmap, vmin=0, vmax=vmax if vmax else 3.0, origin="lower", aspect="auto")
            ax.set_xticks(range(len(warmups)), [str(w) for w in warmups])
            ax.set_yticks(range(len(peaks)), [f"{p:g}" for p in peaks])
            ax.set(xlabel="warmup steps", ylabel="peak learning rate",
                   title=f"{norm}: {what.replace('_', ' ')}")
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"{s['layers']}+{s['layers']} layers, {s['steps']} steps, mean over seeds {s['seeds']} "
                 "(X diverged, - stuck, per seed)", fontsize=9)
    figs["grid"] = fig

    fig, axes = common.new_figure(len(peaks), 2, width=3.0, height=2.6)
    axes = axes.reshape(2, len(peaks))
    for row, norm in enumerate(NORMS):
        for col, peak in enumerate(peaks):
            ax = axes[row, col]
            for j, warmup in enumerate(warmups):
                for r in res["grid"]:
                    if (r["norm"], r["peak"], r["warmup"]) == (norm, peak, warmup) and r["loss_curve"]:
                        c = numpy.array(r["loss_curve"])
                        ax.plot(c[:, 0], c[:, 1], color=f"C{j}", lw=1, alpha=0.8,
                                label=f"warmup {warmup}" if r["seed"] == s["seeds"][0] else None)
            entropy = numpy.mean([r["entropy"] for r in res["grid"]])
            ax.axhline(entropy, color="grey", ls=":", lw=0.8)
            ax.set(title=f"{norm}, peak {peak:g}", xlabel="step", ylabel="training loss", ylim=(0, 3.5))
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    figs["curves"] = fig
    return figs


if __name__ == "__main__":
    common.main(sys.modules[__name__])
