"""Is the softmax needed? Attention with raw scores as weights, normalised or not, against softmax, trained.

A reader's question the paper does not answer: the weights of §3.2.1 are softmax(Q K^T / sqrt(d_k)); what if
the scores themselves weight the values? Here the weights are
    softmax     softmax(S), S = Q K^T / sqrt(d_k)          (the paper)
    raw         S                                          (linear attention with no normalisation)
    normalised  S / (sum_j |S_j| + 1)                      (signed weights whose sizes sum to at most 1)
on the same key-value retrieval task as attention_variants.py (32 pairs, so one key must win over 31 others),
at d_k = 4, 16, 64, 128 over 5 seeds: held-out accuracy and loss, the largest weight, the gradient at the
scores, the time per step. Without the exponential, the right key can only win if its score stands clear of
31 others' by the geometry of q and k alone, which needs room: d_k at least about the number of keys that
must be told apart. The measurement says from which d_k that holds.

Every arm gets its own Adam learning rate, tuned on seeds apart from the compared ones by the rule of
experiments/protocols/no_softmax.json (read here; its sha256 is stored with the results): one rate for every arm
would favour the arm it happens to suit. Each run is stored as it finishes (resumable.py), under the protocol's hash.

    python experiments/no_softmax.py            # about 10 minutes on one CPU core
    python experiments/no_softmax.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
from retrieval import QUICK_RETRIEVAL, aggregate, run_tuned, steps_or_censored

NAME = "no_softmax"
PROTOCOL = common.protocol(NAME)
RESUMABLE = True
SOURCE = "this project's question"
LABELS = {"scaled": "softmax(S)", "raw": "S (no softmax)", "normalised": "S / (sum|S| + 1)"}
SETTINGS = PROTOCOL["settings"]
QUICK = dict(QUICK_RETRIEVAL, kinds=["scaled", "raw", "normalised"], d_ks=[4, 16], seeds=[0, 1], lrs=[1e-3, 3e-3],
             tune_seeds=[100], tie=0.02)


def run(s, progress=True, folder=None) -> dict:
    """Tune and train every arm (retrieval.run_tuned, stored in ``folder`` as each run finishes), then summarise."""
    arms = [(kind, d_k) for d_k in s["d_ks"] for kind in s["kinds"]]
    res = run_tuned(s, arms, folder, log=print if progress else (lambda line: None))
    return {"runs": res["runs"], "tuning": res["tuning"], "lrs": res["lrs"], "scores": res["scores"],
            "ties": res["ties"], "summary": aggregate(res["runs"], s["kinds"], s["d_ks"]), "labels": LABELS,
            "comparisons": comparisons(res["runs"], s)}


def comparisons(runs: list, s: dict) -> dict:
    """Each softmax-free kind against the softmax at each d_k, paired by seed: the final held-out accuracy (the
    question: lower without the softmax) and the steps to the target accuracy (more without it, a run that never
    got there counted as steps + eval_every). The paper makes no claim here; "reproduced" reads "the softmax
    is needed", "opposite" "it is not"."""
    import stats

    def arm(kind, d_k):
        mine = [r for r in runs if (r["kind"], r["d_k"]) == (kind, d_k)]
        return {"accuracy": {r["seed"]: r["final_accuracy"] for r in mine},
                "steps": {r["seed"]: steps_or_censored(r, s) for r in mine}}

    out = {}
    for kind in s["kinds"][1:]:
        for d_k in s["d_ks"]:
            out[f"{LABELS[kind]} - softmax(S), d_k = {d_k}"] = {
                "claim": "worse without the softmax", "formats": {"accuracy": "+.3f", "steps": "+.0f"},
                "source": SOURCE, **stats.compare(arm(s["kinds"][0], d_k), arm(kind, d_k),
                                                  {"accuracy": (-1, 0.0), "steps": (1, 0.0)}, PROTOCOL["bounds"])}
    return stats.correct(out)


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    d_ks, kinds = s["d_ks"], s["kinds"]
    fig, axes = common.new_figure(len(d_ks) + 1, width=3.4, height=3.2)
    for i, kind in enumerate(kinds):
        finals = [[r["final_accuracy"] for r in res["runs"] if r["kind"] == kind and r["d_k"] == d_k]
                  for d_k in d_ks]
        axes[0].plot(d_ks, [numpy.mean(f) for f in finals], "o-", color=f"C{i}", label=LABELS[kind])
        for d_k, f in zip(d_ks, finals):
            axes[0].plot([d_k] * len(f), f, ".", color=f"C{i}", alpha=0.6)
        for ax, d_k in zip(axes[1:], d_ks):
            for r in res["runs"]:
                if r["kind"] == kind and r["d_k"] == d_k:
                    ax.plot(r["step"], r["accuracy"], color=f"C{i}", lw=1, alpha=0.8)
            ax.set(title=f"d_k = {d_k}", xlabel="step", ylim=(0, 1.02))
    chance = 1.0 / s["num_values"]
    for ax in axes:
        ax.axhline(chance, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    axes[0].set(xscale="log", xlabel="d_k", ylabel="held-out accuracy", ylim=(0, 1.02),
                title=f"Final accuracy ({s['steps']} steps)")
    axes[0].set_xticks(d_ks, [str(d) for d in d_ks])
    axes[0].legend(fontsize=7)
    return {"accuracy": fig}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
