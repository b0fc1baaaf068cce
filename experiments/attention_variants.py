"""Dot-product (unscaled and scaled) against additive attention, trained, at small and large d_k.

The paper's claim (§3.2.1): "While for small values of d_k the two mechanisms perform similarly, additive
attention outperforms dot product attention without scaling for larger values of d_k. We suspect that for
large values of d_k, the dot products grow large in magnitude, pushing the softmax function into regions where
it has extremely small gradients. To counteract this effect, we scale the dot products by 1/sqrt(d_k)."

What this script measures, on key-value retrieval through one attention layer (experiments/retrieval.py:
32 pairs, 8 queries, 128 keys, 32 values, d_model 64; the query and key projections start with unit-variance
components, the paper's premise), for each scoring function at d_k = 4 and 128 over 3 seeds:
- held-out accuracy and loss curves, and the steps to reach 90% accuracy;
- softmax saturation: the mean largest attention weight, at initialisation and while training;
- the gradient that reaches the scores: mean |dL/dscore| at the softmax's input, on a fixed batch;
- the time per training step, and the peak memory of one forward + backward (tracemalloc: what NumPy
  allocates, above what was in use before).
Additive attention is Bahdanau's v^T tanh(q W_q + k W_k), with a hidden layer of d_k units (mt.layers).

    python experiments/attention_variants.py            # about 4 minutes on 2 CPU cores
    python experiments/attention_variants.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
from retrieval import QUICK_RETRIEVAL, RETRIEVAL, run_grid

NAME = "attention_variants"
LABELS = {"dot": "dot product, unscaled", "scaled": "dot product / sqrt(d_k)", "additive": "additive"}
SETTINGS = dict(RETRIEVAL, kinds=["dot", "scaled", "additive"], d_ks=[4, 128], seeds=[0, 1, 2])
QUICK = dict(QUICK_RETRIEVAL, kinds=["dot", "scaled", "additive"], d_ks=[4, 16], seeds=[0])


def run(s, progress=True) -> dict:
    return run_grid(s, "attention variants", LABELS, progress)


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    d_ks, kinds = s["d_ks"], s["kinds"]
    fig, axes = common.new_figure(4, len(d_ks), width=3.6, height=3.0)
    axes = numpy.asarray(axes).reshape(len(d_ks), 4)
    for row, d_k in zip(axes, d_ks):
        for i, kind in enumerate(kinds):
            runs = [r for r in res["runs"] if r["kind"] == kind and r["d_k"] == d_k]
            for j, key in enumerate(("accuracy", "loss", "max_weight", "score_grad")):
                for r in runs:
                    row[j].plot(r["step"], r[key], color=f"C{i}", alpha=0.8, lw=1,
                                label=LABELS[kind] if r is runs[0] else None)
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
            g = res["summary"][f"{kind}/{d_k}"]
            reached = [x if x is not None else s["steps"] for x in g["steps_to_target"]]
            steps.append(reached)
            times.append(g["ms_per_step"]["mean"])
            memory.append(g["peak_bytes_per_step"]["mean"] / 2 ** 20)
        x = numpy.arange(len(d_ks)) + i * width
        ax_s.bar(x, [numpy.mean(r) for r in steps], width, color=f"C{i}", label=LABELS[kind])
        for xi, r in zip(x, steps):
            ax_s.plot([xi] * len(r), r, "k.", ms=4)
        ax_t.bar(x, times, width, color=f"C{i}", label=LABELS[kind])
        ax_m.bar(x, memory, width, color=f"C{i}", label=LABELS[kind])
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
