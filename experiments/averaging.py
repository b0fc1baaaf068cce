"""Checkpoint averaging (§6.1), measured through the command line: the last checkpoint against the average of
the last 2, 5 and 10.

The paper: "For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints." Here each seed
runs the commands a reader would type:

    minitransformer train --task toy --steps 1000 --save-every 25 --keep 40 --eval-every 1000 --out DIR \\
        --no-plots --no-progress --seed S
    minitransformer evaluate --checkpoint DIR/checkpoint-STEP.safetensors --split test --average M

for M = 1 (the checkpoint itself), 2, 5, 10, at STEP = 400 and 600 (budgets where the model has not yet
saturated) and 1000 (the toy default's convergence, valid BLEU 99), and reads the BLEU from the JSON evaluate
writes. Beside it, the same averaged weights (``load_run``, the command's own loader) give the true test
perplexity (no label smoothing), so "averaging helps" is judged on both: BLEU higher and perplexity lower. A
checkpoint file named by its step makes evaluate average the M files ending there; the Noam schedule
does not depend on the step limit, so the files up to step 600 of this run are those a 600-step run writes,
and one run per seed serves every budget (hence --keep 40, every file of the run, instead of the last 10).
--eval-every 1000 keeps the default's early stop at valid BLEU 99 from ending a run before its last budget.
Saving every 25 steps, the last 10 files span 225 steps: about a fifth of the run, where the paper's last 5 of
the base model span 40 minutes of its 12 hours.

Besides, every file from step 200 on is scored alone (evaluate --average 1): the BLEU curve the averages are set
against. Averages and the last file come from the same run, so each seed's gain (average minus last) is paired.

    python experiments/averaging.py            # about 5 minutes on 2 CPU cores
    python experiments/averaging.py --quick    # seconds
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import common  # first: it sets the BLAS threads before NumPy loads
import training

from minitransformer.kit import cli
from minitransformer.kit.cli.common import load_run

NAME = "averaging"

PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]
QUICK = {"task": "toy", "steps": 8, "save_every": 2, "keep": 4, "budgets": [4, 8], "averages": [1, 2],
         "curve_from": 6, "seeds": [0], "limit": 20}


def command(argv: list) -> str:
    """Run ``minitransformer ARGV`` in this process; its printed output (returned) is kept out of the
    experiment's. A failed command raises, with what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = cli.main([str(a) for a in argv])
    if code != 0:
        raise RuntimeError(f"minitransformer {' '.join(map(str, argv))} exited with {code}:\n{printed.getvalue()}")
    return printed.getvalue()


def evaluate(folder: Path, step: int, average: int, limit=None, perplexity: bool = False) -> dict:
    """``minitransformer evaluate`` of the average of the last ``average`` checkpoints up to ``step``: its JSON
    (bleu, the checkpoint files used, ...) with the steps of those files added; perplexity: also the averaged
    model's true test perplexity (no label smoothing), from the same files as the command averaged."""
    path = folder / f"eval-{step}-{average}.json"
    checkpoint = folder / f"checkpoint-{step}.safetensors"
    command(["evaluate", "--checkpoint", checkpoint, "--split", "test", "--average", average, "--json", path]
            + ([] if limit is None else ["--limit", limit]))
    result = json.loads(path.read_text(encoding="utf-8"))
    used = result["checkpoint"] if isinstance(result["checkpoint"], list) else [result["checkpoint"]]
    result["steps"] = [int(Path(f).stem.split("-")[1]) for f in used]
    if perplexity:
        ck, model, src_tok, tgt_tok, files = load_run(checkpoint, average)
        assert files == used, (files, used)                      # the model the command scored
        model.eval()
        batches = training.split_batches(ck.extra["task"], "test", src_tok, tgt_tok, limit=limit)
        result["ppl"] = training.true_perplexity(model, batches)
    return result


def run_one(job: tuple) -> dict:
    """Train one seed with the command line, then evaluate every (budget, M) and the single-file curve."""
    s, seed = job
    with tempfile.TemporaryDirectory(prefix="averaging-") as tmp:
        folder = Path(tmp) / f"seed{seed}"
        command(["train", "--task", s["task"], "--steps", s["steps"], "--save-every", s["save_every"],
                 "--keep", s["keep"], "--eval-every", s["steps"], "--out", folder, "--no-plots",
                 "--no-progress", "--seed", seed] + ([] if s["limit"] is None else ["--limit", s["limit"]]))
        metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
        bleu = {str(steps): {str(m): evaluate(folder, steps, m, s["limit"], perplexity=True) for m in s["averages"]}
                for steps in s["budgets"]}
        curve = {step: evaluate(folder, step, 1, s["limit"])["bleu"]
                 for step in range(s["save_every"], s["steps"] + 1, s["save_every"]) if step >= s["curve_from"]}
    return {"seed": seed, "train_seconds": metrics["train_seconds"], "steps": metrics["steps"],
            "train_bleu_at_end": metrics["bleu"],   # the test BLEU the train command printed: evaluate's M=1 at the end
            "bleu": {b: {m: e["bleu"] for m, e in by_m.items()} for b, by_m in bleu.items()},
            "ppl": {b: {m: e["ppl"] for m, e in by_m.items()} for b, by_m in bleu.items()},
            "averaged_steps": {b: {m: e["steps"] for m, e in by_m.items()} for b, by_m in bleu.items()},
            "curve": {"step": list(curve), "bleu": list(curve.values())}}


def gains(runs: list, budget: int, average: int) -> list:
    """Per seed: BLEU of the average of the last ``average`` checkpoints minus the last one's, at ``budget``."""
    return [r["bleu"][str(budget)][str(average)] - r["bleu"][str(budget)]["1"] for r in runs]


def run(s, progress=True) -> dict:
    with common.progress(len(s["seeds"]), "averaging runs (train + evaluate)", disable=not progress) as bar:
        runs = training.run_many(run_one, [(s, seed) for seed in s["seeds"]], progress=bar)
    results = summarize(runs, s)
    print(markdown_table(results["table"], s))
    return results


def comparisons(runs: list, s: dict) -> dict:
    """The mean of the last M checkpoints against the last one alone, at each budget, paired by seed: "helps" is
    BLEU higher and perplexity lower."""
    import stats

    metrics = {"bleu": (1, 0.0), "ppl": (-1, 0.0)}
    out = {}
    for b in s["budgets"]:
        last = {k: {r["seed"]: r[k][str(b)]["1"] for r in runs} for k in metrics}
        for m in s["averages"][1:]:
            arm = {k: {r["seed"]: r[k][str(b)][str(m)] for r in runs} for k in metrics}
            out[f"last {m} - last 1, {b} steps"] = {"claim": "averaging helps", "formats": {"ppl": "+.3f"},
                                                    **stats.compare(last, arm, metrics, PROTOCOL["bounds"])}
    return stats.correct(out)


def summarize(runs: list, s: dict) -> dict:
    """The table (mean +- sample SD over seeds) and the comparisons, from the runs alone."""
    table = [{"steps": b, "average": m, "bleu": common.summary([r["bleu"][str(b)][str(m)] for r in runs]),
              "ppl": common.summary([r["ppl"][str(b)][str(m)] for r in runs]),
              "gain": common.summary(gains(runs, b, m)), "gain_per_seed": gains(runs, b, m),
              "averaged_steps": runs[0]["averaged_steps"][str(b)][str(m)]}
             for b in s["budgets"] for m in s["averages"]]
    return {"runs": runs, "table": table, "comparisons": comparisons(runs, s),
            "train_seconds": common.summary([r["train_seconds"] for r in runs])}


def markdown_table(table: list, s: dict) -> str:
    title = (f"Checkpoint averaging on the {s['task']} corpus, test BLEU and true test perplexity (no label "
             f"smoothing), {len(s['seeds'])} seeds, a checkpoint every {s['save_every']} steps")
    header = ["steps", "checkpoints averaged", "their steps", "BLEU (mean +- sample SD)", "min .. max",
              "gain over the last (mean +- sample SD)", "gain per seed", "test PPL (mean +- sample SD)"]
    rows = []
    for row in table:
        steps = row["averaged_steps"]
        span = f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
        rows.append([row["steps"], row["average"], span, common.mean_std(row["bleu"]),
                     f"{row['bleu']['min']:.2f} .. {row['bleu']['max']:.2f}", common.mean_std(row["gain"], sign="+"),
                     ", ".join(f"{g:+.2f}" for g in row["gain_per_seed"]), common.mean_std(row["ppl"], ".3f")])
    return common.markdown_table(title, header, rows)


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    budgets, averages = s["budgets"], s["averages"]
    fig, axes = common.new_figure(len(budgets) + 1, width=3.6, height=3.3)

    # The single checkpoints' BLEU along training, a line per seed; each budget's averaging window shaded.
    for i, r in enumerate(res["runs"]):
        axes[0].plot(r["curve"]["step"], r["curve"]["bleu"], color=f"C{i}", lw=1, label=f"seed {r['seed']}")
    for b in budgets:
        widest = next(row for row in res["table"] if row["steps"] == b and row["average"] == max(averages))
        axes[0].axvspan(widest["averaged_steps"][0], b, color="grey", alpha=0.15)
    axes[0].set(xlabel="step", ylabel="test BLEU of the checkpoint alone",
                title=f"single checkpoints (shaded: the last {max(averages)})")
    axes[0].legend(fontsize=7)

    # BLEU against the number of checkpoints averaged, a line per seed (paired), the mean in black.
    for ax, b in zip(axes[1:], budgets):
        for i, r in enumerate(res["runs"]):
            ax.plot(averages, [r["bleu"][str(b)][str(m)] for m in averages], "o-", color=f"C{i}", ms=3, lw=1,
                    alpha=0.7)
        ax.plot(averages, [next(row["bleu"]["mean"] for row in res["table"] if row["steps"] == b and
                                row["average"] == m) for m in averages], "s-", color="k", ms=4, label="mean")
        ax.set(xlabel="checkpoints averaged (1: the last)", ylabel="test BLEU", title=f"{b} steps",
               xticks=averages)
        ax.legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    return {"bleu": fig}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
