"""The paper's Table 3 on the toy corpus, as what it measures there: how fast each row learns.

Table 3 varies the base model one row at a time: (A) the number of heads at fixed computation (h * d_k fixed),
(B) a smaller key size d_k, (C) the model's size (layers N, width d_model, feed-forward width d_ff), (D) dropout
and label smoothing, (E) learned position embeddings instead of sinusoids. Here the base model is what
``minitransformer train --task toy`` trains (N = 2, d_model = 64, d_ff = 128, h = 4, d_k = 16, P_drop = 0.1,
label smoothing 0.1), and each row changes it the way the paper's row changes its base.

Trained to convergence every row reaches BLEU 99 on this corpus, so what a row can change is the speed of
learning. Each run is evaluated every EVAL_EVERY steps on the first VALID_SENTENCES validation sentences
(greedy BLEU, and the true perplexity, without label smoothing, on the whole validation split), and measured as

    steps to 90   the first evaluation at which the mean BLEU of the last SMOOTH evaluations reaches 90 (a
                  moving mean, so that one lucky or unlucky checkpoint cannot decide a row); a run that never
                  gets there within MAX_STEPS counts as MAX_STEPS + EVAL_EVERY and is marked censored
    PPL at 300    the mean perplexity of the evaluations at steps 275, 300 and 325
    BLEU at 300   the mean BLEU of the same evaluations

Confounds handled the same way for every row:

- the learning rate: the Noam schedule scales it by d_model^-0.5 and each row may prefer another, so every row
  gets its rate factor chosen from the protocol's factors on tuning seeds (none a compared seed) by the mean steps
  to 90, a factor other than 1 only when it is faster by more than one evaluation interval (choose_factor);
- row (E): a learned table starts at std d_model^-0.5 (0.125 at d_model 64), against about 0.71 per entry for
  the sinusoids, so it is run twice: as initialised, and rescaled to std 0.71 (learned, scaled);
- row (D): P_drop 0.2 (the paper's row) and 0.3 beside each other.

Row (B) is run two ways. The paper's row shrinks the keys alone (d_k 32 and 16, d_v kept at 64): here d_k 8 and
4 with d_v kept at 16 (rows "d_k=8, d_v=16" and "d_k=4, d_v=16"). Rows "d_k=8" and "d_k=4" shrink the values
with the keys (d_v = d_k), which also narrows each head's output and W_o; the parameter counts say by how much.

Every row runs its seeds paired with the base's; each comparison has the per-seed differences (row - base), a
95% Student's t interval and a verdict (experiments/stats.py). The protocol, experiments/protocols/table3.json,
is read here; each finished run is stored in DIR/runs-HASH/finished/ (HASH: the protocol's sha256) and skipped
when the script runs again: the study can be finished across sittings, and a changed protocol starts a new
store. DIR/results.json is written once every run of the protocol has finished (until then
DIR/runs-HASH/results.json holds what has).

    python experiments/table3.py            # many CPU-hours; resumable, the cheapest comparisons first
    python experiments/table3.py --collect  # only rebuild results.json from the finished runs
    python experiments/table3.py --quick    # seconds
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from dataclasses import replace

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import resumable
import stats
import training

NAME = "table3"
PROTOCOL = common.protocol(NAME)

# The base model of this table: the command line's toy-corpus model.
BASE = {"num_encoder_layers": 2, "d_model": 64, "d_ff": 128, "num_heads": 4, "d_k": 16, "dropout": 0.1,
        "label_smoothing": 0.1, "positional": "sinusoidal"}
SINUSOID_STD = math.sqrt(0.5)       # the root mean square of a sinusoid table's entries

# name: (the paper's group, the changes to BASE, the paper's row that changes its base the same way, that row's
# dev perplexity and BLEU, and the sign the paper's row gives (steps to 90, PPL) against the base: +1 slower /
# higher, -1 faster / lower, 0 no difference). The paper's base: N 6, d_model 512, d_ff 2048, h 8, d_k 64,
# 4.92, 25.8; a row within 0.02 PPL and 0.1 BLEU of it counts as "no difference".
ROWS = {
    "base": ("", {}, "base", 4.92, 25.8, None),
    "h=1": ("A", {"num_heads": 1, "d_k": 64}, "h=1, d_k=512", 5.29, 24.9, (1, 1)),
    "h=2": ("A", {"num_heads": 2, "d_k": 32}, "h=4, d_k=128", 5.00, 25.5, (1, 1)),
    "h=8": ("A", {"num_heads": 8, "d_k": 8}, "h=16, d_k=32", 4.91, 25.8, (0, 0)),
    "h=16": ("A", {"num_heads": 16, "d_k": 4}, "h=32, d_k=16", 5.01, 25.4, (1, 1)),
    "d_k=8": ("B", {"d_k": 8}, "d_k=32", 5.01, 25.4, (1, 1)),
    "d_k=4": ("B", {"d_k": 4}, "d_k=16", 5.16, 25.1, (1, 1)),
    "d_k=8, d_v=16": ("B", {"d_k": 8, "d_v": 16}, "d_k=32, d_v=64", 5.01, 25.4, (1, 1)),
    "d_k=4, d_v=16": ("B", {"d_k": 4, "d_v": 16}, "d_k=16, d_v=64", 5.16, 25.1, (1, 1)),
    "N=1": ("C", {"num_encoder_layers": 1}, "N=4", 5.19, 25.3, (1, 1)),
    "N=3": ("C", {"num_encoder_layers": 3}, "N=8", 4.88, 25.5, (1, -1)),
    "d_model=32": ("C", {"d_model": 32, "d_k": 8}, "d_model=256, d_k=32", 5.75, 24.5, (1, 1)),
    "d_model=128": ("C", {"d_model": 128, "d_k": 32}, "d_model=1024, d_k=128", 4.66, 26.0, (-1, -1)),
    "d_ff=64": ("C", {"d_ff": 64}, "d_ff=1024", 5.12, 25.4, (1, 1)),
    "d_ff=256": ("C", {"d_ff": 256}, "d_ff=4096", 4.75, 26.2, (-1, -1)),
    "P_drop=0": ("D", {"dropout": 0.0}, "P_drop=0.0", 5.77, 24.6, (1, 1)),
    "P_drop=0.2": ("D", {"dropout": 0.2}, "P_drop=0.2", 4.95, 25.5, (1, 1)),
    "P_drop=0.3": ("D", {"dropout": 0.3}, "P_drop=0.2 (a larger step)", 4.95, 25.5, (1, 1)),
    "ls=0": ("D", {"label_smoothing": 0.0}, "eps_ls=0.0", 4.67, 25.3, (1, -1)),
    "ls=0.2": ("D", {"label_smoothing": 0.2}, "eps_ls=0.2", 5.47, 25.7, (0, 1)),
    "learned": ("E", {"positional": "learned"}, "positional embedding", 4.92, 25.7, (0, 0)),
    "learned, scaled": ("E", {"positional": "learned", "position_std": SINUSOID_STD}, "positional embedding",
                        4.92, 25.7, (0, 0)),
}

# The rows in the order they are run: the decisive and cheap comparisons first, then the keys-only rows of (B).
ORDER = ["base", "h=1", "learned", "learned, scaled", "ls=0", "d_model=32", "d_model=128", "N=1", "P_drop=0",
         "P_drop=0.2", "P_drop=0.3", "h=16", "d_k=4", "d_k=4, d_v=16", "N=3", "h=2", "h=8", "d_k=8", "d_k=8, d_v=16",
         "d_ff=64", "d_ff=256", "ls=0.2"]

SETTINGS = PROTOCOL["settings"]
QUICK = {"task": "toy", "max_steps": 8, "eval_every": 2, "smooth": 2, "target": 1.0, "at_step": 4,
         "valid_sentences": 10, "factors": [0.5, 1.0], "tune_seeds": [100], "resolution": 2, "seeds": [0, 1],
         "rows": ["base", "h=1", "learned, scaled", "d_k=4, d_v=16"], "margins": {"steps": 50.0, "ppl": 0.05}}

METRICS = ("steps", "ppl")     # the two measures every comparison reads
QUANTITY = "learning speed: steps to BLEU 90 and perplexity at step 300, not the paper's final dev PPL and BLEU"


def row_settings(task: str, name: str, seed: int, factor: float, steps: int) -> dict:
    """The `train` settings of one row: BASE with the row's changes, both stacks N layers deep."""
    changes = {**BASE, **ROWS[name][1]}
    changes.pop("position_std", None)
    changes["num_decoder_layers"] = changes["num_encoder_layers"]
    return training.settings_for(task, steps=steps, seed=seed, lr_factor=factor, **changes)


def scale_positions(model, std: float) -> None:
    """Rescale a model's learned position tables to entries of standard deviation ``std``."""
    for name, p in model.named_parameters():
        if name.endswith("_pos.P"):
            p.data *= std / p.data.std()


def run_one(job: dict) -> dict:
    """Train one (row, seed, factor), evaluating every eval_every steps, until the moving mean of BLEU reaches
    the target (and the run has passed at_step + eval_every) or max_steps."""
    import minitransformer as mt
    from minitransformer.kit.data.task_data import task_data
    from minitransformer.kit.running.runs import build_trainer

    training._one_blas_thread()
    s, row = job["s"], job["row"]
    settings = row_settings(s["task"], row, job["seed"], job["factor"], s["max_steps"])
    mt.backend.manual_seed(settings["seed"])
    with contextlib.redirect_stdout(io.StringIO()):
        data = task_data(settings)
    valid_batches = data.valid_batches
    data = replace(data, metric_fn=None, valid_batches=[])       # evaluated here, not by the trainer
    trainer = build_trainer(settings, data, None)
    model = trainer.model
    if "position_std" in ROWS[row][1]:
        scale_positions(model, ROWS[row][1]["position_std"])
    pairs = training.load_pairs(s["task"], "valid")[: s["valid_sentences"]]
    curve = []                                                   # [step, BLEU, PPL]
    while trainer.step < s["max_steps"]:
        trainer.max_steps = trainer.step + s["eval_every"]
        trainer.fit()
        model.eval()
        bleu = training.bleu_of(model, data.src_tok, data.tgt_tok, pairs, lowercase=False)[0]
        curve.append([trainer.step, round(float(bleu), 3), round(training.true_perplexity(model, valid_batches), 5)])
        model.train()
        if trainer.step > s["at_step"] and measures(curve, s)["steps"] is not None:
            break
    return {"row": row, "seed": job["seed"], "factor": job["factor"], "params": model.num_parameters(),
            "train_seconds": trainer.summary()["train_seconds"], "curve": curve, **measures(curve, s)}


def measures(curve: list, s: dict) -> dict:
    """steps to the target (the smoothed BLEU), the smoothed BLEU and the PPL around at_step, from a curve."""
    steps, bleu, ppl = (numpy.array([c[k] for c in curve], dtype=float) for k in range(3))
    k = s["smooth"]
    smoothed = numpy.convolve(bleu, numpy.ones(k) / k, mode="valid") if len(bleu) >= k else numpy.array([])
    reached = numpy.flatnonzero(smoothed >= s["target"])
    around = numpy.abs(steps - s["at_step"]) <= s["eval_every"] * (k // 2)
    return {"steps": int(steps[reached[0] + k - 1]) if reached.size else None,
            "bleu_at": float(bleu[around].mean()) if around.any() else None,
            "ppl_at": float(ppl[around].mean()) if around.any() else None,
            "final_smoothed_bleu": float(smoothed[-1]) if smoothed.size else None}


def steps_or_censored(result: dict, s: dict) -> float:
    return result["steps"] if result["steps"] is not None else s["max_steps"] + s["eval_every"]


def tuning_means(tuning: list, s: dict) -> dict:
    """{factor: its steps to the target averaged over the tuning seeds}."""
    return {f: float(numpy.mean([steps_or_censored(r, s) for r in tuning if r["factor"] == f])) for f in s["factors"]}


def choose_factor(tuning: list, s: dict) -> float:
    """The factor with the fewest mean steps over the tuning seeds, but one other than 1 (the default) only when
    it is faster than 1 by more than s["resolution"] steps; among such factors within s["resolution"] of the
    fastest, the one nearest 1 (then the smaller)."""
    mean = tuning_means(tuning, s)
    better = [f for f in mean if f != 1.0 and mean[f] < mean[1.0] - s["resolution"]]
    if not better:
        return 1.0
    fastest = min(mean[f] for f in better)
    return min((f for f in better if mean[f] <= fastest + s["resolution"]), key=lambda f: (abs(math.log(f)), f))


def _key(row: str, seed: int, factor: float | None = None) -> str:
    name = row.replace(", ", "_").replace(" ", "_")
    return f"{name}-s{seed}" if factor is None else f"{name}-tune{factor:g}-s{seed}"


def tuning_jobs(s: dict, row: str) -> list:
    return [(_key(row, seed, f), {"s": s, "row": row, "seed": seed, "factor": f})
            for f in s["factors"] for seed in s["tune_seeds"]]


def seed_jobs(s: dict, row: str, factor: float) -> list:
    return [(_key(row, seed), {"s": s, "row": row, "seed": seed, "factor": factor}) for seed in s["seeds"]]


def run_study(s: dict, folder, log=print, after=None, wait: float = 30.0) -> None:
    """Every row in order: its tuning runs, its factor, its seeds; finished runs skipped. Processes sharing the
    study (one per core) never start a row's seeds before all its tuning runs have finished, since the factor is
    chosen from all of them: a row another process still tunes is passed over, and looked at again after
    ``wait`` seconds once nothing else is left to start."""
    while True:
        tuning_elsewhere = False
        for row in s["rows"]:
            jobs = tuning_jobs(s, row)
            resumable.run_pending(jobs, run_one, folder, log=log, after=after)
            tuned = list(resumable.collect(folder, [k for k, _ in jobs]).values())
            if len(tuned) < len(jobs):
                tuning_elsewhere = True
                continue
            resumable.run_pending(seed_jobs(s, row, choose_factor(tuned, s)), run_one, folder, log=log, after=after)
        if not tuning_elsewhere:
            return
        time.sleep(wait)


def aggregate(s: dict, folder) -> dict:
    """The table and the paired comparisons from the finished runs; the rows still missing named."""
    table, runs = {}, {}
    for row in s["rows"]:
        tuned = list(resumable.collect(folder, [k for k, _ in tuning_jobs(s, row)]).values())
        factor = choose_factor(tuned, s) if len(tuned) == len(tuning_jobs(s, row)) else None
        mine = list(resumable.collect(folder, [k for k, _ in seed_jobs(s, row, factor or 1.0)]).values()) \
            if factor is not None else []
        if stale := [r["key"] for r in mine if r["factor"] != factor]:
            raise ValueError(f"table3: {', '.join(stale)} ran at another rate factor than the tuning chooses "
                             f"({factor:g}): delete their files in {folder}/finished and run the study again")
        runs[row] = {r["seed"]: r for r in mine}
        group, changes, paper_row, paper_ppl, paper_bleu, _ = ROWS[row]
        entry = {"group": group, "changes": changes, "factor": factor,
                 "tuning": {f"{f:g}": x for f, x in tuning_means(tuned, s).items()} if factor else {},
                 "seeds": sorted(runs[row]), "params": (mine or tuned or [{}])[0].get("params"),
                 "censored": sum(r["steps"] is None for r in mine),
                 "paper": {"row": paper_row, "ppl": paper_ppl, "bleu": paper_bleu}}
        for name, values in (("steps", [steps_or_censored(r, s) for r in mine]),
                             ("ppl", [r["ppl_at"] for r in mine]), ("bleu", [r["bleu_at"] for r in mine])):
            entry[name] = {"values": values, "mean": stats.mean_sd(values)[0] if values else None,
                           "sd": stats.mean_sd(values)[1] if len(values) > 1 else None}
        table[row] = entry
    comparisons = {}
    base = {"steps": {k: steps_or_censored(r, s) for k, r in runs["base"].items()},
            "ppl": {k: r["ppl_at"] for k, r in runs["base"].items()}}
    for row in s["rows"]:
        if row == "base":
            continue
        arm = {"steps": {k: steps_or_censored(r, s) for k, r in runs[row].items()},
               "ppl": {k: r["ppl_at"] for k, r in runs[row].items()}}
        expected = ROWS[row][5]
        c = stats.compare(base, arm, {m: (expected[i], s["margins"][m]) for i, m in enumerate(METRICS)})
        n = len(c["metrics"]["steps"]["seeds"])
        c["status"] = "complete" if n == len(s["seeds"]) else f"running / pending ({n} of {len(s['seeds'])} seeds)"
        comparisons[row] = {"against": "base", "quantity": QUANTITY, **c}
    stats.correct(comparisons)
    pending = [row for row in s["rows"] if len(runs[row]) < len(s["seeds"])]
    return {"table": table, "comparisons": comparisons, "pending_rows": pending,
            "runs": [r for row in s["rows"] for r in runs[row].values()]}


def markdown(payload: dict) -> str:
    """The table: each row's chosen rate factor, its measures (mean +- sample SD over seeds), the paired
    differences from the base with their 95% intervals, the verdict, and the paper's row beside."""
    s, res = payload["settings"], payload["results"]
    header = ["row", "change", "params", "rate factor", "seeds", "steps to 90", "PPL at 300", "BLEU at 300",
              "d steps [95% CI]", "d PPL [95% CI]", "verdict, before Holm", "paper's row", "paper PPL", "paper BLEU"]
    rows = []
    for name, t in res["table"].items():
        c = res["comparisons"].get(name)
        change = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in t["changes"].items())
        censored = f" ({t['censored']} censored)" if t["censored"] else ""
        verdict = (stats.shown(c["verdict"], c) if c["status"] == "complete" else c["status"]) if c else \
            ("" if len(t["seeds"]) == len(s["seeds"]) else "running / pending")
        rows.append([f"{t['group']} {name}".strip(), change or "-", f"{t['params']:,}" if t["params"] else "-",
                     "-" if t["factor"] is None else f"{t['factor']:g}", len(t["seeds"]),
                     _cell(t["steps"], ".0f") + censored, _cell(t["ppl"], ".3f"), _cell(t["bleu"], ".1f"),
                     stats.fmt_diff(c["metrics"]["steps"], "+.0f") if c else "",
                     stats.fmt_diff(c["metrics"]["ppl"], "+.3f") if c else "", verdict,
                     t["paper"]["row"], f"{t['paper']['ppl']:.2f}", f"{t['paper']['bleu']:.1f}"])
    title = (f"Table 3 on the {s['task']} corpus as learning speed: steps until the mean valid BLEU of "
             f"{s['smooth']} evaluations {s['eval_every']} steps apart reaches {s['target']:g} (at most "
             f"{s['max_steps']} steps); mean +- sample SD over seeds; differences paired by seed (row - base)")
    return common.markdown_table(title, header, rows)


def _cell(m: dict, fmt: str) -> str:
    if m["mean"] is None:
        return "-"
    return f"{m['mean']:{fmt}}" + (f" +- {m['sd']:{fmt}}" if m["sd"] is not None else "")


def figures(payload) -> dict:
    """Each row's smoothed valid BLEU against steps, a line per seed, the base's seeds in grey in every panel."""
    s, res = payload["settings"], payload["results"]
    names = [n for n in res["table"] if res["table"][n]["seeds"]]
    if not names:
        return {}
    cols = min(4, len(names))
    fig, axes = common.new_figure(cols, math.ceil(len(names) / cols), width=3.4, height=2.6)
    k = s["smooth"]
    fig.suptitle(f"Valid BLEU, the mean of the last {k} evaluations, one line per seed; grey: the base's seeds; "
                 f"dashed: {s['target']:g}")
    for i, (ax, name) in enumerate(zip(axes, names)):
        for row, colour in (("base", "0.7"), (name, "C0")):
            for r in res["runs"]:
                if r["row"] == row:
                    c = numpy.array(r["curve"], dtype=float)
                    if len(c) >= k:
                        ax.plot(c[k - 1:, 0], numpy.convolve(c[:, 1], numpy.ones(k) / k, mode="valid"),
                                color=colour, lw=1)
        ax.axhline(s["target"], color="k", lw=0.6, ls="--")
        ax.set(title=name, xlabel="step", ylabel="valid BLEU" if i % cols == 0 else None, ylim=(0, 100))
    for ax in axes[len(names):]:
        ax.axis("off")
    return {"curves": fig}


def write_results(s: dict, folder, store, quick: bool, started: float):
    """results.json of the runs in ``store``: into ``folder`` once none is pending, into ``store`` until then."""
    results = {**aggregate(s, store), "wall_seconds_of_runs": resumable.wall_seconds(store)}
    return common.save(store if results["pending_rows"] else folder, NAME, s, results, started, quick,
                       None if quick else PROTOCOL)


def main(argv=None) -> None:
    p = common.parser(__doc__)
    p.add_argument("--collect", action="store_true", help="only rebuild results.json from the finished runs")
    args = p.parse_args(argv)
    started = time.perf_counter()
    s = QUICK if args.quick else SETTINGS
    folder = common.out_dir(args, NAME)
    store = folder / f"runs-{(common.digest(s) if args.quick else PROTOCOL['sha256'])[:12]}"
    if not args.collect and not args.replot:
        run_study(s, store, log=lambda line: print(line, flush=True),
                  after=lambda: write_results(s, folder, store, args.quick, started))
    path = write_results(s, folder, store, args.quick, started) if not args.replot else folder / "results.json"
    payload = json.loads(path.read_text(encoding="utf-8"))
    for name, fig in figures(payload).items():
        common.save_figure(fig, folder, f"{NAME}_{name}")
    print(markdown(payload))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
