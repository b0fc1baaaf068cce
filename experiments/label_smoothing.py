"""Label smoothing's trade-off (§5.4) on the toy corpus: perplexity, BLEU, token accuracy and calibration.

The paper: "During training, we employed label smoothing of value eps_ls = 0.1. This hurts perplexity, as the
model learns to be more unsure, but improves accuracy and BLEU score." Here the model ``minitransformer train
--task toy`` trains (its defaults but for the smoothing) is trained with eps_ls = 0, 0.1 and 0.2, over 5 seeds,
and measured after 300, 600 and 1000 steps: 1000 is the default run's convergence (valid BLEU 99, where every
setting saturates), 300 and 600 are budgets where BLEU still has room to differ. Each run trains once through
all the budgets: the Noam schedule does not depend on the step limit, so the model at step 600 of a longer run
is the model a 600-step run ends with (the test checks this). Measured at each budget:

    perplexity      exp(cross-entropy without smoothing) on the validation split, dropout off: the true one,
                    whatever loss the model was trained with
    BLEU            greedy corpus BLEU on the 500 test sentences
    token accuracy  how often the most probable next token is the reference, teacher forcing, validation split
    calibration     the reliability diagram of those predictions (confidence of the argmax against how often it
                    is right, 10 bins) and its expected calibration error ECE; the mean confidence

The same seed gives the same initial weights, batches and dropout masks whatever eps_ls is (smoothing draws no
random numbers), so the differences are paired: each seed's eps_ls > 0 run minus its eps_ls = 0 run, set against
the spread of the seeds.

    python experiments/label_smoothing.py            # about 15 minutes on 2 CPU cores
    python experiments/label_smoothing.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import training

NAME = "label_smoothing"

PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]
QUICK = {"task": "toy", "epsilons": [0.0, 0.1], "seeds": [0], "budgets": [3, 6], "bins": 10}

METRICS = {"ppl": "perplexity (valid)", "bleu": "BLEU (test)", "token_accuracy": "token accuracy (valid)",
           "mean_confidence": "mean confidence (valid)", "ece": "ECE (valid)"}


def train_through(settings: dict, budgets: list, measure) -> list:
    """Train one run, stopping at each step count of ``budgets`` (increasing) to call measure(trainer, data);
    -> the measurements, one per budget. The run goes on from where it stopped, as if never interrupted."""
    trainer, data = training.train(dict(settings, steps=budgets[0]))
    found = [measure(trainer, data)]
    for steps in budgets[1:]:
        trainer.max_steps = steps
        trainer.fit()
        trainer.model.eval()
        found.append(measure(trainer, data))
    return found


def run_one(job: tuple) -> dict:
    """Train one (eps_ls, seed) through every budget and measure it at each."""
    task, epsilon, seed, budgets, bins = job

    def measure(trainer, data) -> dict:
        model = trainer.model
        calibration = training.token_calibration(model, data.valid_batches, bins=bins)
        return {"steps": trainer.step, "train_seconds": trainer.summary()["train_seconds"],
                "ppl": training.true_perplexity(model, data.valid_batches),
                "bleu": training.test_bleu(model, data, task), **calibration}

    settings = training.settings_for(task, label_smoothing=epsilon, seed=seed)
    return {"epsilon": epsilon, "seed": seed, "at": train_through(settings, budgets, measure)}


def pooled_reliability(calibrations: list) -> dict:
    """The reliability diagrams of several runs (token_calibration's dicts, the same bins) as one: per bin, the
    count summed and the confidence and accuracy averaged over every token in it; the ECE of the pooled bins."""
    count = numpy.sum([c["count"] for c in calibrations], axis=0)                       # (bins,)
    weighted = {key: numpy.nansum([numpy.nan_to_num(c[key]) * numpy.asarray(c["count"]) for c in calibrations],
                                  axis=0) for key in ("confidence", "accuracy")}
    filled = count > 0
    with numpy.errstate(invalid="ignore", divide="ignore"):
        confidence = numpy.where(filled, weighted["confidence"] / count, numpy.nan)
        accuracy = numpy.where(filled, weighted["accuracy"] / count, numpy.nan)
    ece = float(numpy.sum(count[filled] / count.sum() * numpy.abs(accuracy[filled] - confidence[filled])))
    return {"count": count.tolist(), "confidence": confidence.tolist(), "accuracy": accuracy.tolist(), "ece": ece}


def paired_differences(runs: list, key: str, budget_index: int, epsilon: float, baseline: float = 0.0) -> list:
    """Per seed: the run with ``epsilon`` minus the run with ``baseline`` (same seed), of ``key`` at one budget."""
    value = {(r["epsilon"], r["seed"]): r["at"][budget_index][key] for r in runs}
    return [value[(epsilon, seed)] - value[(baseline, seed)] for (e, seed) in value if e == epsilon]


def run(s, progress=True) -> dict:
    jobs = [(s["task"], eps, seed, s["budgets"], s["bins"]) for eps in s["epsilons"] for seed in s["seeds"]]
    with common.progress(len(jobs), "label smoothing runs", disable=not progress) as bar:
        runs = training.run_many(run_one, jobs, progress=bar)
    results = summarize(runs, s)
    print(markdown_table(results["table"], s))
    return results


def comparisons(runs: list, s: dict) -> dict:
    """Each eps_ls > 0 against eps_ls = 0 at each budget, paired by seed, one comparison per part of the paper's
    sentence: it hurts perplexity (higher), it improves BLEU (higher), it improves accuracy (higher)."""
    import stats

    claims = {"ppl": ("hurts perplexity", "+.3f"), "bleu": ("improves BLEU", "+.2f"),
              "token_accuracy": ("improves accuracy", "+.4f")}
    out = {}
    base = s["epsilons"][0]
    for b, steps in enumerate(s["budgets"]):
        for eps in s["epsilons"][1:]:
            arms = {e: {key: {r["seed"]: r["at"][b][key] for r in runs if r["epsilon"] == e} for key in claims}
                    for e in (base, eps)}
            for key, (claim, fmt) in claims.items():
                out[f"eps {eps:g} - eps {base:g}, {steps} steps: {claim}"] = {
                    "claim": claim, "formats": {key: fmt},
                    **stats.compare(arms[base], arms[eps], {key: (1, 0.0)}, PROTOCOL["bounds"])}
    return stats.correct(out)


def summarize(runs: list, s: dict) -> dict:
    """The table (mean +- sample SD over seeds, paired differences) and the comparisons, from the runs alone."""
    table = []
    for b, steps in enumerate(s["budgets"]):
        for eps in s["epsilons"]:
            mine = [r["at"][b] for r in runs if r["epsilon"] == eps]
            row = {"steps": steps, "epsilon": eps, **{key: common.summary([m[key] for m in mine]) for key in METRICS},
                   "reliability": pooled_reliability(mine)}
            if eps != s["epsilons"][0]:
                row["minus_baseline"] = {key: common.summary(paired_differences(runs, key, b, eps,
                                                                                s["epsilons"][0]))
                                         for key in METRICS}
            table.append(row)
    return {"runs": runs, "table": table, "comparisons": comparisons(runs, s)}


def markdown_table(table: list, s: dict) -> str:
    """Mean +- sample standard deviation over the seeds; the paired difference from eps_ls = epsilons[0] beside."""
    title = (f"Label smoothing on the {s['task']} corpus, {len(s['seeds'])} seeds (mean +- sample SD over "
             f"seeds; d: the paired difference from eps_ls = {s['epsilons'][0]}, mean +- sample SD)")
    header = ["steps", "eps_ls", "perplexity (valid)", "BLEU (test)", "token accuracy", "mean confidence", "ECE",
              "d perplexity", "d BLEU", "d accuracy"]
    rows = []
    for row in table:
        d = row.get("minus_baseline")
        differences = ["", "", ""] if d is None else [
            common.mean_std(d["ppl"], ".3f", "+"), common.mean_std(d["bleu"], sign="+"),
            common.mean_std(d["token_accuracy"], ".4f", "+")]
        rows.append([row["steps"], row["epsilon"], common.mean_std(row["ppl"], ".3f"), common.mean_std(row["bleu"]),
                     common.mean_std(row["token_accuracy"], ".4f"), f"{row['mean_confidence']['mean']:.3f}",
                     common.mean_std(row["ece"], ".3f"), *differences])
    return common.markdown_table(title, header, rows)


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    budgets, epsilons = s["budgets"], s["epsilons"]

    # The reliability diagram at each budget: the seeds' tokens pooled, one line per eps_ls, the diagonal.
    fig, axes = common.new_figure(len(budgets), 2, width=3.6, height=3.3)
    for col, steps in enumerate(budgets):
        top, bottom = axes[col], axes[len(budgets) + col]
        top.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":", label="calibrated")
        for i, eps in enumerate(epsilons):
            row = next(r for r in res["table"] if r["steps"] == steps and r["epsilon"] == eps)
            rel = row["reliability"]
            top.plot(rel["confidence"], rel["accuracy"], "o-", color=f"C{i}", ms=3,
                     label=f"eps_ls {eps}: ECE {rel['ece']:.3f}")
            edges = numpy.linspace(0, 1, len(rel["count"]) + 1)
            bottom.stairs(numpy.asarray(rel["count"]) / numpy.sum(rel["count"]), edges, color=f"C{i}",
                          label=f"eps_ls {eps}")
        top.set(title=f"{steps} steps", xlabel="confidence of the predicted token", ylabel="accuracy",
                xlim=(0, 1), ylim=(0, 1))
        bottom.set(xlabel="confidence", ylabel="share of tokens", yscale="log", xlim=(0, 1))
        top.legend(fontsize=7, loc="upper left")
        bottom.legend(fontsize=7, loc="upper left")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)

    # Every measurement against the budget: a dot per seed, the mean joined.
    fig2, axes2 = common.new_figure(len(METRICS), width=3.3, height=3.1)
    for ax, (key, label) in zip(axes2, METRICS.items()):
        for i, eps in enumerate(epsilons):
            values = [[r["at"][b][key] for r in res["runs"] if r["epsilon"] == eps] for b in range(len(budgets))]
            ax.plot(budgets, [numpy.mean(v) for v in values], "o-", color=f"C{i}", ms=3, label=f"eps_ls {eps}")
            for steps, v in zip(budgets, values):
                ax.plot([steps] * len(v), v, ".", color=f"C{i}", alpha=0.5)
        ax.set(xlabel="training steps", title=label)
        if key == "ppl":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes2[0].legend(fontsize=7)
    return {"reliability": fig, "metrics": fig2}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
