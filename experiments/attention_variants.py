"""Dot-product (unscaled and scaled) against additive attention, trained, at small and large d_k.

The paper's claim (§3.2.1): "While for small values of d_k the two mechanisms perform similarly, additive
attention outperforms dot product attention without scaling for larger values of d_k. We suspect that for
large values of d_k, the dot products grow large in magnitude, pushing the softmax function into regions where
it has extremely small gradients. To counteract this effect, we scale the dot products by 1/sqrt(d_k)."

What this script measures, on key-value retrieval through one attention layer (experiments/retrieval.py:
32 pairs, 8 queries, 128 keys, 32 values, d_model 64; the query and key projections start with unit-variance
components, the paper's premise), for each scoring function at d_k = 4 and 128 over 5 seeds:
- held-out accuracy and loss curves, and the steps to reach 90% accuracy;
- softmax saturation: the mean largest attention weight, at initialisation and while training;
- the gradient that reaches the scores: mean |dL/dscore| at the softmax's input, on a fixed batch;
- the time per training step, and the peak memory of one forward + backward (tracemalloc: what NumPy
  allocates, above what was in use before).
Additive attention is Bahdanau's v^T tanh(q W_q + k W_k), with a hidden layer of d_k units (mt.layers), and,
as a second arm, of 128 units: at d_k = 4 a hidden layer of 4 units is a far smaller network than the paper's
additive attention, whose hidden size does not shrink with d_k.

The protocol (experiments/protocols/attention_variants.json, read here; its sha256 is stored with the results)
fixes the arms, the seeds, the tuning and the verdict rule before the runs. Every arm (scoring function, d_k)
gets its own Adam learning rate, chosen from its grid on tuning seeds that are not compared seeds, by the mean
held-out loss over the run (retrieval.choose_lr: how soon it learns and whether it stays learned both count; a
stated tie rule): the same effort for every arm. Then the compared seeds at that rate; the comparisons are paired
by seed (the same data stream and initial embeddings), with 95% intervals and verdicts (experiments/stats.py).
Each run is stored as it finishes (resumable.py), under the protocol's hash: an interrupted study resumes.

    python experiments/attention_variants.py            # about 11 minutes on 2 idle CPU cores
    python experiments/attention_variants.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
from retrieval import QUICK_RETRIEVAL, aggregate, run_tuned, steps_or_censored

NAME = "attention_variants"
PROTOCOL = common.protocol(NAME)
RESUMABLE = True
LABELS = {"dot": "dot product, unscaled", "scaled": "dot product / sqrt(d_k)", "additive": "additive, d_hidden = d_k"}
SETTINGS = PROTOCOL["settings"]
QUICK = dict(QUICK_RETRIEVAL, kinds=["dot", "scaled", "additive", "additive:32"], d_ks=[4, 16], seeds=[0, 1],
             lrs=[1e-3, 3e-3], tune_seeds=[100], tie=0.02, margins={"steps": 50.0, "loss": 0.05})


def label(kind: str) -> str:
    if kind.startswith("additive:"):
        return f"additive, d_hidden = {kind.split(':')[1]}"
    return LABELS[kind]


def arms(s: dict) -> list:
    """(kind, d_k) of every arm; an additive arm whose hidden size equals d_k is the plain "additive" one."""
    return [(kind, d_k) for d_k in s["d_ks"] for kind in s["kinds"] if kind != f"additive:{d_k}"]


def run(s, progress=True, folder=None) -> dict:
    """Tune and train every arm (retrieval.run_tuned, stored in ``folder`` as each run finishes), then summarise."""
    res = run_tuned(s, arms(s), folder, log=print if progress else (lambda line: None))
    return {**summarize(res["runs"], res["tuning"], res["lrs"], s), "scores": res["scores"], "ties": res["ties"]}


def comparisons(runs: list, s: dict) -> dict:
    """Paired by seed, at each d_k: each additive arm against unscaled dot products (the paper: alike at small
    d_k, additive better at large d_k), and scaled against unscaled dot products at the largest d_k (the reason
    for the scale). Metrics: steps to the target accuracy (lower is better) and the final held-out loss."""
    import stats

    def arm(kind, d_k):
        mine = [r for r in runs if (r["kind"], r["d_k"]) == (kind, d_k)]
        return {"steps": {r["seed"]: steps_or_censored(r, s) for r in mine},
                "loss": {r["seed"]: r["final_loss"] for r in mine}}

    small, large = min(s["d_ks"]), max(s["d_ks"])
    out = {}
    for kind, d_k in arms(s):
        if kind.startswith("additive"):
            sign = 0 if d_k == small else -1
            claim = "alike at small d_k" if d_k == small else "additive better at large d_k"
            out[f"{label(kind)} - unscaled dot, d_k = {d_k}"] = {
                "claim": claim, "formats": {"steps": "+.0f", "loss": "+.2e"},
                **stats.compare(arm("dot", d_k), arm(kind, d_k),
                                {m: (sign, s["margins"][m]) for m in ("steps", "loss")}, PROTOCOL["bounds"])}
    out[f"scaled - unscaled dot, d_k = {large}"] = {
        "claim": "scaling helps at large d_k", "formats": {"steps": "+.0f", "loss": "+.2e"},
        **stats.compare(arm("dot", large), arm("scaled", large), {m: (-1, s["margins"][m]) for m in ("steps", "loss")},
                        PROTOCOL["bounds"])}
    return stats.correct(out)


def summarize(runs: list, tuning_runs: list, lrs: dict, s: dict) -> dict:
    return {"runs": runs, "tuning": tuning_runs, "lrs": lrs,
            "summary": aggregate(runs, s["kinds"], s["d_ks"]),
            "labels": {kind: label(kind) for kind in s["kinds"]}, "comparisons": comparisons(runs, s)}


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    d_ks, kinds = s["d_ks"], s["kinds"]
    fig, axes = common.new_figure(4, len(d_ks), width=3.6, height=3.0)
    axes = numpy.asarray(axes).reshape(len(d_ks), 4)
    for row, d_k in zip(axes, d_ks):
        for i, kind in enumerate(kinds):
            runs = [r for r in res["runs"] if r["kind"] == kind and r["d_k"] == d_k]
            if not runs:
                continue
            for j, key in enumerate(("accuracy", "loss", "max_weight", "score_grad")):
                for r in runs:
                    row[j].plot(r["step"], r[key], color=f"C{i}", alpha=0.8, lw=1,
                                label=label(kind) if r is runs[0] else None)
        row[0].set(ylabel=f"d_k = {d_k}\nheld-out accuracy", ylim=(0, 1.02))
        row[1].set(ylabel="held-out loss", yscale="log")
        row[2].set(ylabel="mean largest weight", ylim=(0, 1.02))
        row[3].set(ylabel="mean |dL/dscore|", yscale="log")
        for ax in row:
            ax.grid(alpha=0.3)
            ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=7)
    axes[0, 0].set_title("accuracy (one line per seed)")
    axes[0, 1].set_title("loss")
    axes[0, 2].set_title("softmax saturation")
    axes[0, 3].set_title("gradient at the scores")
    out = {"curves": fig}

    fig, (ax_s, ax_t, ax_m) = common.new_figure(3, width=4.2, height=3.4)
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        steps, times, memory = [], [], []
        for d_k in d_ks:
            g = res["summary"].get(f"{kind}/{d_k}") or res["summary"][f"additive/{d_k}"]
            reached = [x if x is not None else s["steps"] for x in g["steps_to_target"]]
            steps.append(reached)
            times.append(g["ms_per_step"]["mean"])
            memory.append(g["peak_bytes_per_step"]["mean"] / 2 ** 20)
        x = numpy.arange(len(d_ks)) + i * width
        ax_s.bar(x, [numpy.mean(r) for r in steps], width, color=f"C{i}", label=label(kind))
        for xi, r in zip(x, steps):
            ax_s.plot([xi] * len(r), r, "k.", ms=4)
        ax_t.bar(x, times, width, color=f"C{i}", label=label(kind))
        ax_m.bar(x, memory, width, color=f"C{i}", label=label(kind))
    for ax in (ax_s, ax_t, ax_m):
        ax.set_xticks(numpy.arange(len(d_ks)) + width * (len(kinds) - 1) / 2, [f"d_k = {d}" for d in d_ks])
        ax.grid(alpha=0.3, axis="y")
    ax_s.set(ylabel=f"steps to {s['target_accuracy']:.0%} accuracy (dots: seeds)",
             title=f"Learning speed (never reached: {s['steps']})")
    ax_t.set(ylabel="ms per training step", title="Time per step")
    ax_m.set(ylabel="peak MiB, forward + backward", title=f"Memory per step (batch {s['batch']})")
    ax_s.legend(fontsize=7)
    out["summary"] = fig
    return out


if __name__ == "__main__":
    common.main(sys.modules[__name__])
