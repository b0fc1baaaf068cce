"""The paper's Table 3 on the toy corpus: each row changes one choice of the base model and measures the effect.

Table 3 varies the base model one row at a time: (A) the number of heads at fixed computation (h * d_k fixed),
(B) a smaller key size d_k, (C) the model's size (layers N, width d_model, feed-forward width d_ff), (D) dropout
and label smoothing, (E) learned position embeddings instead of sinusoids. The paper reads off it that single-head
attention is worse and so are too many heads, that a smaller d_k hurts, that bigger models are better, that
dropout helps against over-fitting, and that learned positions do as well as sinusoids.

Here the base model is what ``minitransformer train --task toy`` trains (N = 2, d_model = 64, d_ff = 128, h = 4,
d_k = 16, P_drop = 0.1, label smoothing 0.1), and each row changes it the way the paper's row changes its base
(the same direction, by a similar factor). Trained to convergence every row reaches BLEU 99 on this corpus, and no
row differs; so every run stops after a fixed budget of STEPS optimiser steps (a third of the way to
convergence), where the rows still differ. Each row runs with 3 seeds; measured on the validation split (the
paper's rows are on its development set):

    PPL      the true perplexity per word, exp(cross-entropy without label smoothing), dropout off
    BLEU     greedy corpus BLEU on the 500 validation sentences
    time     seconds of training (the steps only), one BLAS thread, two runs at a time on 2 cores

Two differences from the paper's rows: d_k here sets the size of values as well as keys (the paper's row (B)
shrinks the keys only), and the paper's perplexities are per word piece on newstest2013 after 100,000 steps.

    python experiments/table3.py            # about 20 minutes on 2 CPU cores
    python experiments/table3.py --quick    # seconds
"""

from __future__ import annotations

import sys

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import training

NAME = "table3"

# The base model of this table: the command line's toy-corpus model.
BASE = {"num_encoder_layers": 2, "d_model": 64, "d_ff": 128, "num_heads": 4, "d_k": 16, "dropout": 0.1,
        "label_smoothing": 0.1, "positional": "sinusoidal"}

# name: (the paper's group, the changes to BASE, the paper's row that changes its base the same way, and that
# row's dev perplexity and BLEU). The paper's base: N 6, d_model 512, d_ff 2048, h 8, d_k 64, 4.92, 25.8.
ROWS = {
    "base": ("", {}, "base", 4.92, 25.8),
    "h=1": ("A", {"num_heads": 1, "d_k": 64}, "h=1, d_k=512", 5.29, 24.9),
    "h=2": ("A", {"num_heads": 2, "d_k": 32}, "h=4, d_k=128", 5.00, 25.5),
    "h=8": ("A", {"num_heads": 8, "d_k": 8}, "h=16, d_k=32", 4.91, 25.8),
    "h=16": ("A", {"num_heads": 16, "d_k": 4}, "h=32, d_k=16", 5.01, 25.4),
    "d_k=8": ("B", {"d_k": 8}, "d_k=32", 5.01, 25.4),
    "d_k=4": ("B", {"d_k": 4}, "d_k=16", 5.16, 25.1),
    "N=1": ("C", {"num_encoder_layers": 1}, "N=4", 5.19, 25.3),
    "N=3": ("C", {"num_encoder_layers": 3}, "N=8", 4.88, 25.5),
    "d_model=32": ("C", {"d_model": 32, "d_k": 8}, "d_model=256, d_k=32", 5.75, 24.5),
    "d_model=128": ("C", {"d_model": 128, "d_k": 32}, "d_model=1024, d_k=128", 4.66, 26.0),
    "d_ff=64": ("C", {"d_ff": 64}, "d_ff=1024", 5.12, 25.4),
    "d_ff=256": ("C", {"d_ff": 256}, "d_ff=4096", 4.75, 26.2),
    "P_drop=0": ("D", {"dropout": 0.0}, "P_drop=0.0", 5.77, 24.6),
    "P_drop=0.3": ("D", {"dropout": 0.3}, "P_drop=0.2", 4.95, 25.5),
    "ls=0": ("D", {"label_smoothing": 0.0}, "eps_ls=0.0", 4.67, 25.3),
    "ls=0.2": ("D", {"label_smoothing": 0.2}, "eps_ls=0.2", 5.47, 25.7),
    "learned": ("E", {"positional": "learned"}, "positional embedding", 4.92, 25.7),
}

SETTINGS = {"task": "toy", "steps": 300, "seeds": [0, 1, 2], "rows": list(ROWS)}
QUICK = {"task": "toy", "steps": 8, "seeds": [0], "rows": ["base", "h=1", "learned"]}


def row_settings(task: str, name: str, steps: int, seed: int) -> dict:
    """The `train` settings of one row: BASE with the row's changes, both stacks N layers deep."""
    changes = {**BASE, **ROWS[name][1]}
    changes["num_decoder_layers"] = changes["num_encoder_layers"]
    return training.settings_for(task, steps=steps, seed=seed, **changes)


def run_one(job: tuple) -> dict:
    """Train one (row, seed) and measure it on the validation split."""
    task, name, steps, seed = job
    trainer, data = training.train(row_settings(task, name, steps, seed))
    summary = trainer.summary()
    return {"row": name, "seed": seed, "params": trainer.model.num_parameters(),
            "ppl": training.true_perplexity(trainer.model, data.valid_batches),
            "bleu": training.test_bleu(trainer.model, data, task, split="valid"),
            "train_seconds": summary["train_seconds"], "train_loss": summary["loss"]}


def run(s, progress=True) -> dict:
    jobs = [(s["task"], name, s["steps"], seed) for name in s["rows"] for seed in s["seeds"]]
    with common.progress(len(jobs), "Table 3 runs", disable=not progress) as bar:
        runs = training.run_many(run_one, jobs, progress=bar)
    table = {}
    for name in s["rows"]:
        mine = [r for r in runs if r["row"] == name]
        group, changes, paper_row, paper_ppl, paper_bleu = ROWS[name]
        table[name] = {"group": group, "changes": changes, "params": mine[0]["params"],
                       "ppl": common.summary([r["ppl"] for r in mine]),
                       "bleu": common.summary([r["bleu"] for r in mine]),
                       "train_seconds": common.summary([r["train_seconds"] for r in mine]),
                       "paper": {"row": paper_row, "ppl": paper_ppl, "bleu": paper_bleu}}
    print(markdown_table(table, s))
    return {"runs": runs, "table": table}


def markdown_table(table: dict, s: dict) -> str:
    """The table shaped like the paper's, mean +- standard deviation over the seeds, the paper's row beside."""
    base = table.get("base")
    title = f"Table 3 on the {s['task']} corpus, {s['steps']} steps, {len(s['seeds'])} seeds (mean +- std)"
    header = ["row", "change", "params", "PPL (valid)", "BLEU (valid)", "train s", "dBLEU vs base", "paper's row",
              "paper PPL", "paper BLEU"]
    rows = []
    for name, t in table.items():
        change = ", ".join(f"{k}={v}" for k, v in t["changes"].items()) or "-"
        delta = f"{t['bleu']['mean'] - base['bleu']['mean']:+.1f}" if base and name != "base" else ""
        rows.append([f"{t['group']} {name}", change, f"{t['params']:,}", common.mean_std(t["ppl"]),
                     common.mean_std(t["bleu"], ".1f"), common.mean_std(t["train_seconds"], ".0f"), delta,
                     t["paper"]["row"], f"{t['paper']['ppl']:.2f}", f"{t['paper']['bleu']:.1f}"])
    return common.markdown_table(title, header, rows)


def figures(payload) -> dict:
    """BLEU and perplexity of every row, a dot per seed, the base row's mean as a line; the paper's beside."""
    res = payload["results"]
    names = list(res["table"])
    fig, axes = common.new_figure(3, width=4.6, height=max(3.6, 0.26 * len(names) + 1))
    y = numpy.arange(len(names))[::-1]
    for ax, key, label in ((axes[0], "bleu", "BLEU (valid)"), (axes[1], "ppl", "perplexity (valid, per word)")):
        for yi, name in zip(y, names):
            values = [r[key] for r in res["runs"] if r["row"] == name]
            ax.plot(values, [yi] * len(values), "o", color="C0", alpha=0.6, ms=4)
            ax.plot([numpy.mean(values)], [yi], "|", color="k", ms=12)
        if "base" in res["table"]:
            ax.axvline(res["table"]["base"][key]["mean"], color="grey", lw=0.8, ls="--")
        ax.set(xlabel=label, yticks=y, yticklabels=[f"{res['table'][n]['group']} {n}" for n in names])
        ax.grid(alpha=0.3)
    paper_bleu = [res["table"][n]["paper"]["bleu"] for n in names]
    axes[2].barh(y, paper_bleu, color="C1", alpha=0.7)
    axes[2].set(xlabel="the paper's BLEU (newstest2013)", yticks=y, yticklabels=[res["table"][n]["paper"]["row"]
                                                                                  for n in names],
                xlim=(min(paper_bleu) - 1, max(paper_bleu) + 0.5))
    axes[2].grid(alpha=0.3)
    axes[0].set_title(f"{payload['settings']['steps']} steps, {len(payload['settings']['seeds'])} seeds")
    axes[2].set_title("Table 3 of the paper")
    return {"rows": fig}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
