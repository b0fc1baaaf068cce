"""Table 3's decisive rows on real data: Multi30k German->English, the small preset, a short fixed budget.

On the toy corpus several of Table 3's rows stay inconclusive or confounded (experiments/table3.py). Here the
base model and four rows are trained on Multi30k, 3 seeds each, paired by seed:

    base          what `minitransformer train --task multi30k` trains (d_model 256, h 8, d_k 32, N 3, d_ff 1024,
                  P_drop 0.1, label smoothing 0.1, sinusoids), stopped after STEPS steps
    h=1           one head with d_k = d_model (h * d_k fixed, the paper's row (A) h = 1)
    learned       a learned position table (row (E))
    ls=0          no label smoothing (row (D))
    d_model/2     half the width, d_k halved with it, d_ff kept (row (C)); the Noam rate factor times sqrt(1/2),
                  so that its peak rate, which the schedule scales by d_model^-0.5, is the base's

The budget is STEPS optimiser steps (about 6 epochs, a third of the task's 20) with the warmup halved to match.
The last model is scored, as the paper scored its Table 3 rows (§6.2: no checkpoint averaging), on
test_2016_flickr (1000 sentences, lowercased greedy BLEU) and as the true perplexity (no label smoothing) on test
and valid; the mean of the last 4 checkpoints (a checkpoint every 100 steps) is measured beside it, under
"averaged": this early in training it reaches back into the steep part of the learning curve. Each run
uses one core and one BLAS thread. Each finished run is stored in DIR/finished/ and skipped when the script runs
again, so the study can be finished across sittings; results.json holds what is finished and names the rest.

    python experiments/multi30k_table3.py --data-dir DIR        # hours; resumable
    python experiments/multi30k_table3.py --collect             # only rebuild results.json from finished runs
    python experiments/multi30k_table3.py --quick               # the toy corpus, seconds
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import time
from dataclasses import replace
from pathlib import Path

import common  # first: it sets the BLAS threads before NumPy loads
import resumable
import stats
import training

NAME = "multi30k_table3"

PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]
QUICK = {"task": "toy", "steps": 6, "warmup": 4, "lr_factor": 1.0, "save_every": 2, "average": 2,
         "seeds": [0, 1], "rows": ["base", "d_model/2", "h=1", "ls=0", "learned"],
         "margins": {"test_bleu": 0.5, "test_ppl": 0.2}}

# The sign the paper gives each row's difference from the base (row - base): BLEU, perplexity. 0: no difference
# ("nearly identical", within the margin). Label smoothing "hurts perplexity ... but improves BLEU", so without
# it perplexity falls and BLEU falls.
EXPECTED = {"h=1": {"test_bleu": -1, "test_ppl": +1}, "d_model/2": {"test_bleu": -1, "test_ppl": +1},
            "ls=0": {"test_bleu": -1, "test_ppl": -1}, "learned": {"test_bleu": 0, "test_ppl": 0}}
PAPER_ROW = {"base": "base", "h=1": "(A) h=1", "d_model/2": "(C) d_model=256", "ls=0": "(D) eps_ls=0",
             "learned": "(E) positional embedding"}


def task_model(s: dict) -> dict:
    """The sizes of the task's model: its preset with the task's own changes."""
    from minitransformer.config import PRESETS

    base = training.settings_for(s["task"])
    return {**PRESETS[base["preset"]], **base["model"]}


def row_changes(name: str, s: dict) -> dict:
    """The `train` settings a row changes, computed from the task's model."""
    m = task_model(s)
    if name == "base":
        return {}
    if name == "h=1":
        return {"num_heads": 1, "d_k": m["d_model"]}
    if name == "learned":
        return {"positional": "learned"}
    if name == "ls=0":
        return {"label_smoothing": 0.0}
    if name == "d_model/2":
        half = m["d_model"] // 2
        return {"d_model": half, "d_k": half // m["num_heads"], "lr_factor": s["lr_factor"] * math.sqrt(0.5)}
    raise ValueError(f"{NAME}: unknown row {name!r}; expected one of {', '.join(PAPER_ROW)}")


def run_key(row: str, seed: int) -> str:
    return f"{row.replace('/', '_')}-s{seed}"


def jobs_of(s: dict, folder: Path, data_dir) -> list:
    """(key, job) for every run, in the order that completes a comparison soonest: the base's seeds, then each
    row's seeds, the cheapest row first."""
    jobs = []
    for row in s["rows"]:
        for seed in s["seeds"]:
            key = run_key(row, seed)
            changes = {"steps": s["steps"], "epochs": None, "max_minutes": None, "warmup": s["warmup"],
                       "lr_factor": s["lr_factor"], "save_every": s["save_every"], "keep": s["average"],
                       "average": s["average"], "data_dir": data_dir, "seed": seed, "workers": 1}
            changes.update(row_changes(row, s))
            jobs.append((key, {"row": row, "seed": seed, "settings": training.settings_for(s["task"], **changes),
                               "scratch": str(folder / "runs" / key)}))
    return jobs


def run_one(job: dict) -> dict:
    """Train one (row, seed) to its step limit (resuming its scratch checkpoints if a run was cut short), then
    score the mean of its last checkpoints. The scratch folder is removed once the result is measured."""
    import minitransformer as mt
    from minitransformer.kit.data.task_data import task_data
    from minitransformer.kit.running import checkpoint as ckpt
    from minitransformer.kit.running.runs import build_trainer

    training._one_blas_thread()
    settings, scratch = job["settings"], Path(job["scratch"])
    scratch.mkdir(parents=True, exist_ok=True)
    mt.backend.manual_seed(settings["seed"])
    with contextlib.redirect_stdout(io.StringIO()):          # "building vocabularies ..."
        data = task_data(settings)
    data = replace(data, metric_fn=None)
    trainer = build_trainer(settings, data, str(scratch))
    resumed_at = 0
    if ckpt.list_checkpoints(scratch):
        trainer.resume(str(scratch))
        resumed_at = trainer.step
    trainer.fit()
    model = trainer.model
    model.eval()
    test_batches = training.split_batches(settings["task"], "test", data.src_tok, data.tgt_tok,
                                          settings["data_dir"], settings["max_tokens"])
    pairs = training.load_pairs(settings["task"], "test", settings["data_dir"])
    lowercase = settings["task"] == "multi30k"

    def scores() -> dict:
        return {"test_bleu": float(training.bleu_of(model, data.src_tok, data.tgt_tok, pairs, lowercase)[0]),
                "test_ppl": training.true_perplexity(model, test_batches),
                "valid_ppl": training.true_perplexity(model, data.valid_batches)}

    last = scores()                                          # the last model: what the comparisons read
    used = ckpt.last_checkpoints(scratch, settings["average"])
    model.load_state_dict(ckpt.average_checkpoints(used))
    model.eval()
    averaged = {**scores(), "steps": [ckpt.step_of_file(p) for p in used]}
    summary = trainer.summary()
    history = [[h[0], round(float(h[1]), 4)] for h in trainer.history[::10]]
    result = {"row": job["row"], "seed": job["seed"], "params": model.num_parameters(), "steps": trainer.step,
              "resumed_at": resumed_at, **last, "averaged": averaged,
              "train_seconds": summary["train_seconds"], "train_loss": summary["loss"], "loss_curve": history,
              "settings": {k: v for k, v in settings.items() if k not in ("progress", "plots")}}
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def aggregate(s: dict, finished: dict) -> dict:
    """The table and the paired comparisons from the finished runs; the runs still missing named."""
    by_row = {row: {r["seed"]: r for r in finished.values() if r["row"] == row} for row in s["rows"]}
    table = {}
    for row in s["rows"]:
        runs = by_row[row]
        table[row] = {"paper_row": PAPER_ROW[row], "changes": row_changes(row, s), "seeds": sorted(runs),
                      "params": next(iter(runs.values()))["params"] if runs else None}
        for metric in ("test_bleu", "test_ppl", "valid_ppl"):
            values = [runs[k][metric] for k in sorted(runs)]
            table[row][metric] = {"values": values, "mean": stats.mean_sd(values)[0] if values else None,
                                  "sd": stats.mean_sd(values)[1] if len(values) > 1 else None}
    comparisons = {}
    base = {m: {seed: r[m] for seed, r in by_row["base"].items()} for m in ("test_bleu", "test_ppl")}
    for row in s["rows"]:
        if row == "base":
            continue
        arm = {m: {seed: r[m] for seed, r in by_row[row].items()} for m in ("test_bleu", "test_ppl")}
        metrics = {m: (EXPECTED[row][m], s["margins"][m]) for m in ("test_bleu", "test_ppl")}
        c = stats.compare(base, arm, metrics)
        n = len(c["metrics"]["test_bleu"]["seeds"])
        c["status"] = "complete" if n == len(s["seeds"]) else f"running / pending ({n} of {len(s['seeds'])} seeds)"
        comparisons[row] = {"against": "base", "claim": f"the paper's row {PAPER_ROW[row]}", "untuned": True, **c}
    stats.correct(comparisons)
    pending = [run_key(row, seed) for row in s["rows"] for seed in s["seeds"] if seed not in by_row[row]]
    return {"runs": [finished[k] for k in sorted(finished)], "table": table, "comparisons": comparisons,
            "pending": pending}


def markdown(payload: dict) -> str:
    """The study's table and comparisons, as experiments/README.md shows them."""
    s, res = payload["settings"], payload["results"]
    rows = []
    for row, t in res["table"].items():
        c = res["comparisons"].get(row)
        rows.append([row, t["paper_row"], f"{t['params']:,}" if t["params"] else "-", len(t["seeds"]),
                     _cell(t["test_bleu"]), _cell(t["test_ppl"]), _cell(t["valid_ppl"]),
                     stats.fmt_diff(c["metrics"]["test_bleu"]) if c else "",
                     stats.fmt_diff(c["metrics"]["test_ppl"]) if c else "", stats.shown(c["verdict"], c) if c else "",
                     c["status"] if c else ("complete" if len(t["seeds"]) == len(s["seeds"]) else "running / pending")])
    header = ["row", "paper's row", "params", "seeds", "test BLEU", "test PPL", "valid PPL", "dBLEU [95% CI]",
              "dPPL [95% CI]", "verdict, before Holm", "status"]
    title = (f"Multi30k de->en, small preset, {s['steps']} steps (warmup {s['warmup']}), the last model; mean +- "
             "sample SD over seeds, differences paired by seed (row - base)")
    return common.markdown_table(title, header, rows)


def _cell(m: dict) -> str:
    if m["mean"] is None:
        return "-"
    return f"{m['mean']:.2f}" + (f" +- {m['sd']:.2f}" if m["sd"] is not None else "")


def write_results(s: dict, folder: Path, quick: bool, started: float, data_dir) -> Path:
    keys = [key for key, _ in jobs_of(s, folder, data_dir)]
    results = {**aggregate(s, resumable.collect(folder, keys)), "wall_seconds_of_runs": resumable.wall_seconds(folder)}
    return common.save(folder, NAME, s, results, started, quick)


def main(argv=None) -> None:
    p = common.parser(__doc__)
    p.add_argument("--data-dir", default=None, help="the Multi30k files (see `minitransformer download`)")
    p.add_argument("--collect", action="store_true", help="only rebuild results.json from the finished runs")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs (resume later)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    s = QUICK if args.quick else SETTINGS
    folder = common.out_dir(args, NAME)
    if not args.collect and not args.replot:
        jobs = jobs_of(s, folder, args.data_dir)

        def log(line):
            print(line, flush=True)

        def after():                        # results.json holds each run as soon as it is finished
            write_results(s, folder, args.quick, started, args.data_dir)

        ran = resumable.run_pending(jobs, run_one, folder, log=log, limit=args.max_runs, after=after)
        print(f"ran {ran} run(s)")
    path = write_results(s, folder, args.quick, started, args.data_dir)
    print(markdown(json.loads(path.read_text(encoding="utf-8"))))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
