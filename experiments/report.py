"""experiments/README.md's tables and verdicts, generated from the stored results.json files.

Each generated part of the README sits between two marker lines,

    <!-- BEGIN GENERATED name -->
    ...
    <!-- END GENERATED name -->

and is rewritten from the study's stored results by the function SECTIONS[name]; nothing between the markers is
written by hand, so a verdict cannot outlive its numbers (tests/test_studies_report.py regenerates every part and
fails on any difference).

    python experiments/report.py              # rewrite the generated parts of experiments/README.md
    python experiments/report.py --check      # exit 1 if any part differs from what the results give
    python experiments/report.py --recompute  # first recompute the summaries and comparisons that the stored
                                              # per-seed numbers determine (no training), into the results.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import common  # first: it sets the BLAS threads before NumPy loads
import stats

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
RESULTS = HERE / "results"
MARKER = re.compile(r"<!-- BEGIN GENERATED (?P<name>[\w-]+) -->\n.*?<!-- END GENERATED (?P=name) -->", re.DOTALL)


def load(name: str) -> dict | None:
    path = RESULTS / name / "results.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def pending(name: str, command: str) -> str:
    return f"*Running / pending: no stored results for this part yet; `{command}` produces them.*"


def protocol_line(p: dict, name: str) -> str:
    """Which protocol a stored run followed: the file and its sha256, and whether the file still has that hash."""
    path = common.PROTOCOLS / f"{name}.json"
    if "protocol" not in p:
        if path.exists() and common.protocol(name)["settings"] == p["settings"]:
            return (f"Protocol: run before its protocol was written down; `protocols/{name}.json` records its "
                    "settings and rules.")
        return (f"Protocol: an earlier one (its settings are stored with the run); `protocols/{name}.json` is the "
                "protocol now.")
    sha = p["protocol"]["sha256"]
    now = common.protocol(name)["sha256"] if path.exists() else None
    return (f"Protocol: `protocols/{name}.json`, sha256 {sha[:12]}, fixed before the run"
            + ("." if now == sha else f"; the file has changed since (now {str(now)[:12]}): a rerun is due."))


def _run_line(p: dict) -> str:
    m = p["machine"]
    return (f"Stored run: `{p['command']}`, finished {p['date']}, {p['seconds']:.0f} s wall, {m['cpu']} "
            f"({m['cores']} cores), one BLAS thread. " + protocol_line(p, p["experiment"]))


def _hours(res: dict) -> str:
    """What a resumable study's finished runs cost, each on one core (their wall times added up)."""
    if "wall_seconds_of_runs" not in res:
        return "the runs' wall time not recorded"
    return f"the finished runs took {res['wall_seconds_of_runs'] / 3600:.1f} hours of wall time, one core each"


# ---------------------------------------------------------------------------------------------- the sections

def tuning_note(choices: dict, grid: list, what: str, tie_rule: str, ties: list | None = None) -> str:
    """A line on how each arm's setting was chosen. choices: {arm: (chosen, {value tried: score, lower better})}.
    Names the arms whose choice sits at an end of the grid (a value beyond it was not tried, so the arm may do
    better than measured) and those whose best score was a tie (``ties``, or where not given: an equal lowest
    score), settled by ``tie_rule``."""
    ends = [(f"the smallest {what} tried, {min(grid):g}", [a for a, (c, _) in choices.items() if c == min(grid)]),
            (f"the largest {what} tried, {max(grid):g}", [a for a, (c, _) in choices.items() if c == max(grid)])]
    if len(set(grid)) == 1:                             # one value: no choice was made, so no end to name
        ends = []
    if ties is None:
        ties = [a for a, (_, scores) in choices.items() if list(scores.values()).count(min(scores.values())) > 1]
    parts = [f"{len(arms)} of {len(choices)} chose {end} ({'; '.join(arms)})" for end, arms in ends if arms]
    line = ", ".join(parts)
    if parts:
        line += ": a value beyond the grid was not tried, so these may do better than measured"
    if ties:
        line += f"{'. ' if line else ''}Tied in the tuning, settled by {tie_rule}: {'; '.join(ties)}"
    return f"Tuning: {line}." if line else f"Tuning: every {what} chosen inside the grid, without a tie."


def claims_table(claims: list, title: str) -> str:
    """A study's claims, each with what was measured and the verdict its script derived."""
    return common.markdown_table(title, ["claim", "measured", "reproduced?"],
                                 [[c["claim"], c["measured"], c["verdict"]] for c in claims])


def table1() -> str:
    p = load("table1")
    if p is None or "claims" not in p["results"]:
        return pending("table1", "python experiments/table1.py")
    import table1 as t1

    s, res = p["settings"], p["results"]
    ns, heads = s["ns"], ["n", *(t1.SHORT[k] for k in t1.KINDS)]
    times = [[n, *(f"{res['cost'][k][str(n)]['best_ms']:.3g}" for k in t1.KINDS)] for n in ns]
    memory = [[n, *(f"{res['cost'][k][str(n)]['peak_bytes'] / 2 ** 20:.3g}" for k in t1.KINDS)] for n in ns]
    c, d = res["crossover"], s["d"]
    at = (lambda x: t1.at_n(x, ns))
    crossing = (f"Where self-attention stops being cheaper at d = {d}: in multiply-adds, against the recurrent layer "
                f"{at(c['multiply_adds_self_attention_vs_recurrent_n'])} and against the convolution "
                f"{at(c['multiply_adds_self_attention_vs_convolution_n'])}; in time, against the recurrent layer "
                f"{at(c['time_self_attention_vs_recurrent_n'])}, against the convolution "
                f"{at(c['time_self_attention_vs_convolution_n'])}, and the multi-head layer against the recurrent "
                f"layer {at(c['time_multi_head_vs_recurrent_n'])}.")
    grad = res["gradient_first_to_last"]
    across = "; ".join(f"{t1.SHORT[k]}: " + ", ".join(f"{grad[k][str(n)]:.2g} at n = {n}" for n in ns) for k in grad)
    return "\n\n".join([
        _run_line(p),
        claims_table(res["claims"], f"Table 1's claims at d = {d}; a growth matches a formula when its exponent "
                     "rounds to the formula's power of n, a count when it equals the formula at every n"),
        common.markdown_table("Time, ms (best of repeats), forward + backward", heads, times),
        common.markdown_table("Peak memory, MiB (tracemalloc)", heads, memory),
        crossing,
        (f"|d out_n / d x_1| through one layer (d = {d}, the mean of {t1.GRADIENT_DRAWS} draws; 0 is underflow): "
         f"{across}.")])


def table1_by_d() -> str:
    p = load("table1_by_d")
    if p is None or "claims_by_d" not in p["results"]:
        return pending("table1_by_d", "python experiments/table1.py --out experiments/results/table1_by_d")
    rows = []
    for d, c in p["results"]["crossover_by_d"].items():
        cell = (lambda x: "beyond the range" if x is None else f"{x:.0f}")
        rows.append([d, cell(c["multiply_adds_self_attention_vs_recurrent_n"]),
                     cell(c["time_self_attention_vs_recurrent_n"]),
                     cell(c["multiply_adds_self_attention_vs_convolution_n"]),
                     cell(c["time_self_attention_vs_convolution_n"])])
    ns = p["settings"]["crossover_ns"]
    title = (f"The n at which self-attention stops being cheaper, for each width d (n = {ns[0]} .. {ns[-1]}; "
             "interpolated on log n)")
    return "\n\n".join([_run_line(p), common.markdown_table(title, [
        "d", "vs recurrent, multiply-adds", "vs recurrent, time", "vs convolution, multiply-adds",
        "vs convolution, time"], rows), claims_table(p["results"]["claims_by_d"], "The n < d rule against d")])


def attention_variants() -> str:
    p = load("attention_variants")
    if p is None or "comparisons" not in p["results"]:
        return pending("attention_variants", "python experiments/attention_variants.py")
    import attention_variants as av

    s, res = p["settings"], p["results"]
    rows = []
    for kind, d_k in av.arms(s):
        runs = [r for r in res["runs"] if (r["kind"], r["d_k"]) == (kind, d_k)]
        steps = [av.steps_or_censored(r, s) for r in runs]
        rows.append([av.label(kind), d_k, f"{res['lrs'][f'{kind}/{d_k}']:g}", len(runs),
                     stats.fmt_mean_sd(steps, ".0f"), ", ".join(str(x) for x in steps),
                     stats.fmt_mean_sd([r["final_accuracy"] for r in runs], ".3f"),
                     stats.fmt_mean_sd([r["final_loss"] for r in runs], ".3f"),
                     f"{sum(r['max_weight'][0] for r in runs) / len(runs):.3f}",
                     f"{sum(r['score_grad'][0] for r in runs) / len(runs):.2e}",
                     f"{sum(r['ms_per_step'] for r in runs) / len(runs):.1f}",
                     f"{sum(r['peak_bytes_per_step'] for r in runs) / len(runs) / 2 ** 20:.2f}"])
    title = (f"Key-value retrieval, {s['steps']} steps; the rate chosen per arm from {s['lrs']} on "
             f"{_tuning_seeds(s)} by its mean held-out loss over the run; steps to {s['target_accuracy']:.0%} "
             f"accuracy (never reached: {s['steps']} + {s['eval_every']}); mean +- sample SD over seeds {s['seeds']}")
    tuned = {f"{av.label(kind)}, d_k = {d_k}": _lr_choice(res, f"{kind}/{d_k}") for kind, d_k in av.arms(s)}
    edge = "\n\n" + _lr_note(res, s, tuned, lambda arm: f"{av.label(arm.split('/')[0])}, d_k = {arm.split('/')[1]}")
    return "\n\n".join([_run_line(p) + edge, common.markdown_table(title, [
        "scoring", "d_k", "lr", "seeds", f"steps to {s['target_accuracy']:.0%}", "per seed", "final accuracy",
        "final loss", "largest weight at init", "mean abs dL/dscore at init", "ms/step", "peak MiB/step"], rows),
        common.comparison_table(res["comparisons"])])


def _tuning_seeds(s: dict) -> str:
    seeds = s.get("tune_seeds", [s.get("tune_seed")])
    return f"tuning seed{'s' if len(seeds) > 1 else ''} {', '.join(str(x) for x in seeds)}"


def _lr_choice(res: dict, arm: str) -> tuple:
    """(the chosen rate, {rate tried: its tuning score}) of one arm of a tuned retrieval study."""
    if "scores" in res:
        return res["lrs"][arm], {float(lr): v for lr, v in res["scores"][arm].items()}
    kind, d_k = arm.split("/")
    return res["lrs"][arm], {r["lr"]: r["mean_loss"] for r in res["tuning"]
                             if (r["kind"], str(r["d_k"])) == (kind, d_k)}


def _lr_note(res: dict, s: dict, tuned: dict, name) -> str:
    if "ties" in res:
        return tuning_note(tuned, s["lrs"], "rate", f"the smallest rate within {s['tie']:.0%} of the lowest score",
                           [name(arm) for arm in res["ties"]])
    return tuning_note(tuned, s["lrs"], "rate", "the fewer steps to the target")


def table3() -> str:
    p = load("table3")
    if p is None:
        return pending("table3", "python experiments/table3.py")
    import table3 as t3

    res = p["results"]
    for name, c in res["comparisons"].items():       # how each is shown: the paper's row, steps as whole numbers
        c.setdefault("claim", f"the paper's row {t3.ROWS[name][2]}")
        c.setdefault("formats", {"steps": "+.0f", "ppl": "+.3f"})
    tuned = {row: (t["factor"], {float(f): x for f, x in t["tuning"].items()}) for row, t in res["table"].items()
             if t["factor"] is not None}
    s = p["settings"]
    rule = (f"the default factor 1 unless another is faster by more than {s['resolution']} steps"
            if "resolution" in s else "the higher smoothed BLEU at the end of the tuning run")
    parts = [(f"Stored: {len(res['runs'])} finished seed runs (tuning runs besides), last written {p['date']}; "
              f"{_hours(res)}. {protocol_line(p, 'table3')} Rates tuned on {_tuning_seeds(s)}."),
             t3.markdown(p), tuning_note(tuned, s["factors"], "rate factor", rule),
             common.comparison_table(res["comparisons"])]
    if res["pending_rows"]:
        parts.append("Running / pending (resumed by `python experiments/table3.py`): "
                     + "; ".join(res["pending_rows"]) + ".")   # "; ": some row names hold a comma
    return "\n\n".join(parts)


def table3_300_steps() -> str:
    p = load("table3_300_steps")
    if p is None:
        return pending("table3_300_steps", "(the earlier fixed-budget run; no script)")
    s, res = p["settings"], p["results"]
    rows = []
    for name, t in res["table"].items():
        c = res["comparisons"].get(name)
        rows.append([f"{t['group']} {name}".strip(), f"{t['params']:,}", common.mean_std(t["ppl"], ".3f"),
                     common.mean_std(t["bleu"], ".1f"), stats.fmt_diff(c["metrics"]["bleu"], "+.1f") if c else "",
                     stats.fmt_diff(c["metrics"]["ppl"], "+.3f") if c else "",
                     stats.shown(c["verdict"], c) if c else ""])
    title = (f"The earlier design: every row stopped at {s['steps']} steps, seeds {s['seeds']}, valid split; mean +- "
             "sample SD; differences paired by seed (row - base)")
    return "\n\n".join([common.markdown_table(title, ["row", "params", "PPL", "BLEU", "d BLEU [95% CI]",
                                                      "d PPL [95% CI]", "verdict, before Holm"], rows),
                        common.comparison_table(res["comparisons"])])


def multi30k_table3() -> str:
    p = load("multi30k_table3")
    if p is None:
        return pending("multi30k_table3", "python experiments/multi30k_table3.py --data-dir DIR")
    import multi30k_table3 as m30

    res = p["results"]
    parts = [(f"Stored: {len(res['runs'])} of {len(p['settings']['rows']) * len(p['settings']['seeds'])} runs "
             f"finished, last written {p['date']}; {_hours(res)}."), m30.markdown(p),
             common.comparison_table(res["comparisons"])]
    if res["pending"]:
        parts.append("Running / pending (resumed by `python experiments/multi30k_table3.py --data-dir DIR`): "
                     + "; ".join(res["pending"]) + ".")
    return "\n\n".join(parts)


def label_smoothing() -> str:
    p = load("label_smoothing")
    import label_smoothing as ls

    return "\n\n".join([_run_line(p), ls.markdown_table(p["results"]["table"], p["settings"]),
                        common.comparison_table(p["results"]["comparisons"])])


def warmup_and_norm() -> str:
    p = load("warmup_and_norm")
    s, res = p["settings"], p["results"]
    grads = []
    for key, g in res["grad_norms"].items():
        grads.append([key.replace("/", " "), *(f"{x:.2f}" for x in g["mean"]), f"{g['last_over_first']:.2f}"])
    layers = len(next(iter(res["grad_norms"].values()))["mean"])
    grad_table = common.markdown_table(
        f"Gradient norm per layer at initialisation (mean over {s['grad_batches']} batches x seeds {s['grad_seeds']})",
        ["", *(f"layer {k + 1}" for k in range(layers)), "last / first"], grads)
    rows = []
    for peak in s["peaks"]:
        row = [f"{peak:g}"]
        for warmup in s["warmups"]:
            for norm in ("post-LN", "pre-LN"):
                cell = res["cells"][f"{norm}/{peak:g}/{warmup}"]
                stuck = sum(o != "trained" for o in cell["outcomes"])
                row.append(f"{stats.fmt_mean_sd(cell['final_loss'])} / {stats.fmt_mean_sd(cell['exact_match'])}"
                           + (f" ({stuck} of {len(cell['outcomes'])} {'/'.join(sorted(set(cell['outcomes']) - {'trained'}))})"
                              if stuck else ""))
        rows.append(row)
    total = s.get("match") == "total"
    header = ["rate level (warmup 1's peak)" if total else "peak lr"] + [
        f"{norm}, warmup {w}" for w in s["warmups"] for norm in ("post-LN", "pre-LN")]
    title = (f"Final training loss / exact match after {s['steps']} steps, mean +- sample SD over seeds {s['seeds']} "
             "(runs that did not train: counted and named)"
             + ("; a longer warmup at the same total rate as warmup 1 over the run (a lower peak)" if total else
                "; every warmup at the same peak (a longer warmup: 4-5x the total rate)"))
    verdicts = {}
    for c in res["comparisons"].values():
        for which in ("verdict", "verdict_holm"):
            row = verdicts.setdefault((c["claim"], which), {k: 0 for k in KINDS})
            row[kind(c[which], c)] += 1
    used = [k for k in KINDS if any(v[k] for v in verdicts.values())]
    summary = common.markdown_table("How often each claim holds over the grid's comparisons, before and after Holm:",
                                    ["claim", "", *used],
                                    [[k, "Holm" if w == "verdict_holm" else "uncorrected", *(v[x] for x in used)]
                                     for (k, w), v in verdicts.items()])
    return "\n\n".join([_run_line(p), grad_table, common.markdown_table(title, header, rows), summary,
                        common.comparison_table(res["comparisons"], "+.3f")])


def averaging() -> str:
    p = load("averaging")
    import averaging as av

    return "\n\n".join([_run_line(p), av.markdown_table(p["results"]["table"], p["settings"]),
                        common.comparison_table(p["results"]["comparisons"])])


def no_softmax() -> str:
    p = load("no_softmax")
    if p is None or "comparisons" not in p["results"]:
        return pending("no_softmax", "python experiments/no_softmax.py")
    import no_softmax as ns

    s, res = p["settings"], p["results"]
    rows = []
    for g in res["summary"].values():
        steps = ", ".join("never" if x is None else str(x) for x in g["steps_to_target"])
        lr = res["lrs"][f"{g['kind']}/{g['d_k']}"] if "lrs" in res else s["lr"]
        rows.append([ns.LABELS[g["kind"]], g["d_k"], f"{lr:g}", common.mean_std(g["final_accuracy"], ".3f"),
                     f"{g['final_accuracy']['min']:.3f}", steps, f"{g['max_weight_at_init']:.3f}",
                     f"{g['ms_per_step']['mean']:.1f}"])
    rates = (f"the Adam rate chosen per arm from {s['lrs']} on {_tuning_seeds(s)} by its mean held-out loss over "
             "the run" if "lrs" in s else f"Adam lr {s['lr']:g} for every arm (not tuned)")
    title = (f"Key-value retrieval, {s['steps']} steps, {rates}, seeds {s['seeds']}: final held-out "
             f"accuracy (mean +- sample SD, min), steps to {s['target_accuracy']:.0%} per seed (never: not within "
             f"{s['steps']}; counted as {s['steps'] + s['eval_every']} in the comparisons)")
    parts = [_run_line(p)]
    if "lrs" in s:
        name = (lambda arm: f"{ns.LABELS[arm.split('/')[0]]}, d_k = {arm.split('/')[1]}")
        parts[0] += "\n\n" + _lr_note(res, s, {name(arm): _lr_choice(res, arm) for arm in res["lrs"]}, name)
    return "\n\n".join(parts + [common.markdown_table(title, [
        "weights", "d_k", "lr", "final accuracy", "min", f"steps to {s['target_accuracy']:.0%} (per seed)",
        "largest weight at init", "ms/step"], rows), common.comparison_table(res["comparisons"])])


def restricted_attention() -> str:
    p = load("restricted_attention")
    if p is None or "claims" not in p["results"]:
        return pending("restricted_attention", "python experiments/restricted_attention.py")
    s, res = p["settings"], p["results"]
    span = (lambda x: "-" if x is None else f"{x['min']:.2f} .. {x['max']:.2f}")
    rows = [[c["task"], c["r"], c["layers"], c["reach"], common.mean_std(c["accuracy"], ".3f"),
             f"{c['accuracy']['min']:.3f} .. {c['accuracy']['max']:.3f}", f"{c['bound']:.3f}",
             f"{c['largest_excess']:+.3f}", span(c["within_reach"]), span(c["beyond_reach"])]
            for c in res["configs"].values()]
    title = (f"Held-out accuracy per token after {s['steps']} steps (n = {s['n']}, {s['symbols']} symbols), seeds "
             f"{s['seeds']}: mean +- sample SD and range over seeds, the bound the reach r*L sets, the largest "
             "excess of a seed over it; per position (mean over seeds): the range within reach and beyond it")
    n = s["n"]
    short = [x for x in res["runs"] if x["task"] == "reverse" and x["reach"] < n - 1]
    line = (f"Largest excess of any of the {len(res['runs'])} runs over its bound: "
            f"{res['largest_excess_over_bound']:+.3f}. Reverse with r*L < {n - 1} ({len(short)} runs): mean "
            f"accuracy {res['reverse_short_reach_mean_accuracy']:.3f}; with r*L >= {n - 1}: "
            f"{res['reverse_full_reach_mean_accuracy']:.3f}; copy: {res['copy_mean_accuracy']:.3f}.")
    return "\n\n".join([_run_line(p), common.markdown_table(title, [
        "task", "r", "L", "r*L", "accuracy", "min .. max", "bound", "largest excess", "within reach",
        "beyond reach"], rows), line, claims_table(res["claims"], "§4's claims, each verdict derived from the runs")])


def extrapolation() -> str:
    p = load("extrapolation")
    if p is None or "comparisons" not in p["results"]:
        return pending("extrapolation", "python experiments/extrapolation.py")
    s, res = p["settings"], p["results"]
    L = s["L"]
    span = (lambda x, f=".3f": f"{x['min']:{f}} .. {x['max']:{f}}")
    rows = []
    for key, g in res["summary"].items():
        task, kind = key.split("/")
        at = [r["exact_match"][L] for r in res["runs"] if (r["task"], r["kind"]) == (task, kind)]
        seen = f"{common.mean_std(g['seen_lengths'], '.3f')} ({span(g['seen_lengths'])})"
        first = f"{common.mean_std(g['at_L_plus_1'], '.3f')} ({', '.join(f'{x:.3f}' for x in at)})"
        rows.append([task, kind, len(g["seeds"]), seen, first, common.mean_std(g["unseen_lengths"], ".3f"),
                     f"{g['output_length_unseen']['mean']:.1f} ({span(g['output_length_unseen'], '.1f')})",
                     span(g["teacher_forced_2L_seen"], ".2f"), span(g["teacher_forced_2L_unseen"], ".2f")])
    title = (f"Trained on source lengths 1..{L}, tested on 1..{2 * L} ({s['per_length']} strings per length); "
             f"exact match of the greedy decoding per seed, mean +- sample SD over seeds (range; at {L + 1}: per "
             f"seed); the greedy output's length for sources of {L + 1}..{2 * L} (mean, range over seeds and "
             f"lengths); teacher-forced token accuracy at length {2 * L}, per target position (mean over seeds), "
             f"the range over positions 1..{L} and {L + 1}..{2 * L}")
    rows_info = [r["learned_rows"] for r in res["runs"] if "learned_rows" in r]
    parts = [_run_line(p), common.markdown_table(title, [
        "task", "positions", "seeds", f"lengths 1..{L}", f"length {L + 1}", f"lengths {L + 1}..{2 * L}",
        f"output length, sources {L + 1}..{2 * L}", f"teacher-forced, positions 1..{L}",
        f"positions {L + 1}..{2 * L}"], rows)]
    if rows_info:
        sides = [x[side] for x in rows_info for side in ("src", "tgt")]
        parts.append(
            f"The learned tables, over the {len(rows_info)} learned runs: the largest change of a row that training "
            f"never used, {max(x['max_change_unused'] for x in sides):.1f}; the largest change of a used row, "
            f"{min(x['max_change_used'] for x in sides):.1f} to {max(x['max_change_used'] for x in sides):.1f}; "
            f"the mean norm of the used rows {min(x['norm_used'] for x in sides):.1f} to "
            f"{max(x['norm_used'] for x in sides):.1f}, of the unused rows {min(x['norm_unused'] for x in sides):.1f}"
            f" to {max(x['norm_unused'] for x in sides):.1f}.")
    parts.append(common.comparison_table(res["comparisons"], "+.3f"))
    return "\n\n".join(parts)


STUDIES = ("attention_variants", "no_softmax", "table3", "table3_300_steps", "multi30k_table3", "extrapolation",
           "label_smoothing", "warmup_and_norm", "averaging")
KINDS = ("reproduced", "same direction", "confounded", "opposite", "opposite direction", "inconclusive",
         "at ceiling", "at floor")


def kind(verdict: str, c: dict) -> str:
    """A verdict's kind as the summary counts it: shown as the tables show it, without its source and qualifiers."""
    return stats.shown(verdict, {k: c[k] for k in ("quantity", "confound") if k in c}).split(" (")[0]


def summary() -> str:
    """Every study's comparisons counted by the kind of their verdict, before and after Holm, by the claim's source;
    how many 'reproduced' chance alone would give; the claims read from rules (Table 1, restricted attention)."""
    rows, total, signed, found = [], {}, 0, {"verdict": 0, "verdict_holm": 0}
    for name in STUDIES:
        p = load(name)
        if p is None:
            continue
        done = [c for c in p["results"]["comparisons"].values() if c.get("status", "complete") == "complete"]
        for source in dict.fromkeys(c.get("source", "the paper") for c in done):
            mine = [c for c in done if c.get("source", "the paper") == source]
            counts = {k: [sum(kind(c[w], c) == k for c in mine) for w in ("verdict", "verdict_holm")] for k in KINDS}
            rows.append([name, source, len(mine), *(f"{a} / {b}" if a or b else "" for a, b in counts.values())])
            for k, (a, b) in counts.items():
                total[k] = [x + y for x, y in zip(total.get(k, [0, 0]), (a, b))]
            for c in mine:
                if all(m["expected"] != 0 for m in c["metrics"].values()):
                    signed += 1
                    for w in found:
                        found[w] += c[w] == "reproduced"
    n = sum(r[2] for r in rows)
    rows.append(["all", "", n, *(f"{a} / {b}" for a, b in total.values())])
    claims = [c["verdict"] for name, key in (("table1", "claims"), ("table1_by_d", "claims_by_d"),
                                             ("restricted_attention", "claims"))
              for c in (load(name) or {"results": {}})["results"].get(key, [])]
    by = {w: sum(v.startswith(w) for v in claims) for w in ("yes", "by construction", "the count by construction", "no",
                                                             "only")}
    return "\n\n".join([
        common.markdown_table("Every comparison's verdict, uncorrected / Holm-corrected (within each study, at 0.05), "
                              "by the claim's source", ["study", "source", "comparisons", *KINDS], rows),
        (f"Chance alone: were no compared choice to change anything, a comparison with a signed claim would read "
         f"\"reproduced\" with a probability of at most 2.5% (its first metric's 95% interval clearing zero on the "
         f"claimed side; every further metric must agree too). Of the {signed} comparisons with signed claims on "
         f"every metric, at most about {0.025 * signed:.1f} would come by chance; {found['verdict']} have every "
         f"interval on the claimed side (\"reproduced\", \"same direction\" or \"confounded\" above), "
         f"{found['verdict_holm']} after Holm, which keeps the chance of "
         f"even one false \"reproduced\" or \"opposite\" at 5% per study. A claim of no difference (sign 0) is "
         f"what nothing changing would give, so its \"reproduced\" is not counted here."),
        (f"Claims read from a stated rule rather than a paired interval (Table 1, restricted attention): "
         f"{len(claims)}: {by['yes']} yes, {by['by construction'] + by['the count by construction']} by construction "
         f"(a multiply-add count written into the script; {by['the count by construction']} of them with a timing "
         f"that says no), {by['no'] + by['only']} no or only in part.")])


SECTIONS = {"summary": summary, "table1": table1, "table1-by-d": table1_by_d, "attention-variants": attention_variants,
            "table3": table3,
            "table3-300-steps": table3_300_steps, "multi30k-table3": multi30k_table3,
            "label-smoothing": label_smoothing, "warmup-and-norm": warmup_and_norm, "averaging": averaging,
            "extrapolation": extrapolation, "no-softmax": no_softmax, "restricted-attention": restricted_attention}


# ---------------------------------------------------------------------------------------------- recomputing

def recompute_table3_300_steps(p: dict) -> dict:
    """The earlier fixed-budget Table 3: each row's summary (sample SD) and its paired comparison with the base,
    the paper's signs read as BLEU higher = better, from the per-seed runs it stored."""
    import table3 as t3

    s, runs = p["settings"], p["results"]["runs"]
    table, comparisons = {}, {}
    per = {row: {r["seed"]: r for r in runs if r["row"] == row} for row in s["rows"]}
    for row in s["rows"]:
        group, changes, paper_row, paper_ppl, paper_bleu, expected = t3.ROWS[row]
        mine = list(per[row].values())
        table[row] = {"group": group, "changes": changes, "params": mine[0]["params"],
                      "ppl": common.summary([r["ppl"] for r in mine]), "bleu": common.summary([r["bleu"] for r in mine]),
                      "train_seconds": common.summary([r["train_seconds"] for r in mine]),
                      "paper": {"row": paper_row, "ppl": paper_ppl, "bleu": paper_bleu}}
        if row != "base":
            arms = [{m: {k: r[m] for k, r in per[x].items()} for m in ("bleu", "ppl")} for x in ("base", row)]
            comparisons[row] = {"claim": f"the paper's row {paper_row}", "formats": {"ppl": "+.3f", "bleu": "+.1f"},
                                "quantity": "BLEU and perplexity at step 300, not the paper's final dev BLEU and PPL",
                                **stats.compare(*arms, {"bleu": (-expected[0], 1.0), "ppl": (expected[1], 0.05)})}
    return {**p["results"], "table": table, "comparisons": stats.correct(comparisons)}


def recompute_table3(p: dict) -> dict:
    """The stored Table 3 run: its comparisons named as learning speed, Holm over them, and where a row's rate factor
    was picked on one tuning seed by no more than one evaluation interval (25 steps) over the base's factor 1, the
    rate named as a confound."""
    import table3 as t3

    res, s = p["results"], p["settings"]
    for row, c in res["comparisons"].items():
        t = res["table"][row]
        c["quantity"] = t3.QUANTITY
        c.pop("confound", None)
        gain = t["tuning"].get("1") - t["tuning"].get(f"{t['factor']:g}") if t["factor"] != 1 else None
        if gain is not None and gain <= s["eval_every"] and "tune_seeds" not in s:
            c["confound"] = (f"rate factor {t['factor']:g} against the base's 1, picked on one tuning seed by "
                             f"{gain:.0f} steps, within one evaluation")
    stats.correct(res["comparisons"])
    return res


def recompute_multi30k(p: dict) -> dict:
    """The stored Multi30k study, from its finished run files."""
    import multi30k_table3 as m30
    import resumable

    s, folder = p["settings"], RESULTS / "multi30k_table3"
    finished = resumable.collect(folder, [m30.run_key(row, seed) for row in s["rows"] for seed in s["seeds"]])
    return {**m30.aggregate(s, finished), "wall_seconds_of_runs": resumable.wall_seconds(folder)}


def recompute() -> list:
    """Rewrite the summaries and comparisons of the stored results that their per-seed numbers determine."""
    import attention_variants
    import averaging
    import extrapolation
    import label_smoothing
    import no_softmax
    import restricted_attention
    import table1
    import warmup_and_norm

    done = []
    for name, fn in (("attention_variants", lambda p: attention_variants.summarize(
                         p["results"]["runs"], p["results"]["tuning"], p["results"]["lrs"], p["settings"])),
                     ("label_smoothing", lambda p: label_smoothing.summarize(p["results"]["runs"], p["settings"])),
                     ("averaging", lambda p: averaging.summarize(p["results"]["runs"], p["settings"])),
                     ("warmup_and_norm", lambda p: {**p["results"], "comparisons": warmup_and_norm.comparisons(
                         p["results"]["grid"], p["settings"])}),
                     ("extrapolation", lambda p: extrapolation.summarize(p["results"]["runs"], p["settings"])),
                     ("no_softmax", lambda p: {**p["results"], "comparisons": no_softmax.comparisons(
                         p["results"]["runs"], p["settings"])}),
                     ("restricted_attention", lambda p: restricted_attention.summarize(p["results"]["runs"],
                                                                                       p["settings"])),
                     ("table1", lambda p: table1.derived(p["results"], p["settings"])),
                     ("table1_by_d", lambda p: table1.derived(p["results"], p["settings"])),
                     ("table3_300_steps", recompute_table3_300_steps),
                     ("table3", recompute_table3), ("multi30k_table3", recompute_multi30k)):
        path = RESULTS / name / "results.json"
        if not path.exists():
            continue
        p = json.loads(path.read_text(encoding="utf-8"))
        p["results"] = fn(p)
        p.setdefault("recomputed", "summaries and comparisons recomputed from the stored per-seed numbers")
        path.write_text(json.dumps(p, indent=1, default=common._plain) + "\n", encoding="utf-8")
        done.append(name)
    return done


# ---------------------------------------------------------------------------------------------- the README

def render(text: str) -> str:
    """``text`` with every generated part rewritten from the stored results."""
    def one(match):
        name = match.group("name")
        if name not in SECTIONS:
            raise ValueError(f"experiments/README.md: unknown generated part {name!r}; expected one of "
                             f"{', '.join(SECTIONS)}")
        return f"<!-- BEGIN GENERATED {name} -->\n{SECTIONS[name]()}\n<!-- END GENERATED {name} -->"

    return MARKER.sub(one, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a generated part differs; write nothing")
    p.add_argument("--recompute", action="store_true", help="recompute stored summaries and comparisons first")
    args = p.parse_args(argv)
    if args.recompute:
        print("recomputed:", ", ".join(recompute()) or "nothing")
    text = README.read_text(encoding="utf-8")
    new = render(text)
    if args.check:
        if new != text:
            print("experiments/README.md differs from what the stored results give: run python experiments/report.py")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
