"""Paired comparisons over seeds, and the verdict each study derives from them.

A study trains every arm with the same seeds, so arm B's run with seed s is paired with arm A's run with seed s
(the same initialisation stream and batch order): the per-seed differences B - A carry the effect without the
seed-to-seed spread the two arms share. For n seeds:

    mean     the mean of the n differences
    sd       their sample standard deviation (ddof = 1: the n - 1 of an estimate from a sample)
    ci95     mean -+ t(0.975, n - 1) * sd / sqrt(n), Student's t with n - 1 degrees of freedom

A claim is one or more metrics, each with the sign the paper expects of B - A: +1 (B higher), -1 (B lower) or 0
(no difference: the interval must lie inside -+ a margin the study states). The verdict:

    reproduced     every metric's interval excludes zero on the expected side (or, for 0, lies inside the margin)
    opposite       every metric's interval excludes zero on the other side (for 0: outside zero, any side)
    inconclusive   anything else: an interval crossing zero, or metrics of one comparison that disagree
                   (one as the paper says, another not, e.g. perplexity better and BLEU worse)
"""

from __future__ import annotations

import math

# Student's t, the 0.975 quantile, for 1..30 degrees of freedom (beyond 30 the normal's 1.96 is within 2%).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

VERDICTS = ("reproduced", "opposite", "inconclusive")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"t975: df must be an int >= 1, got {df!r}")
    return T975[df - 1] if df <= len(T975) else 1.96


def mean_sd(values) -> tuple:
    """(mean, sample standard deviation with ddof = 1; nan for a single value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_sd: values must hold at least one number, got none")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def paired(a: dict, b: dict) -> dict:
    """The paired comparison of arm b against arm a, each {seed: value}: the seeds both have, in order.
    -> {"seeds", "diffs" (b - a per seed), "mean", "sd", "ci95": [low, high]} (ci95 None below 2 seeds)."""
    seeds = sorted(set(a) & set(b), key=str)
    diffs = [float(b[s]) - float(a[s]) for s in seeds]
    if not diffs:
        return {"seeds": [], "diffs": [], "mean": None, "sd": None, "ci95": None}
    mean, sd = mean_sd(diffs)
    if len(diffs) < 2:
        return {"seeds": seeds, "diffs": diffs, "mean": mean, "sd": None, "ci95": None}
    half = t975(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    return {"seeds": seeds, "diffs": diffs, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}


def side(ci95, expected: int, margin: float = 0.0) -> str:
    """One metric's reading: "as expected", "against" or "unclear". ``expected`` +1/-1: the sign the claim
    gives the difference; 0: no difference, within -+ ``margin``: shown by an interval inside the margin, and
    refuted only by one wholly outside it (an interval that excludes zero but reaches into the margin leaves a
    difference too small to matter possible)."""
    if expected not in (-1, 0, 1):
        raise ValueError(f"side: expected must be -1, 0 or 1, got {expected!r}")
    if ci95 is None:
        return "unclear"
    low, high = ci95
    if expected == 0:
        if -margin <= low and high <= margin:
            return "as expected"
        return "against" if low > margin or high < -margin else "unclear"
    if (low > 0 and expected > 0) or (high < 0 and expected < 0):
        return "as expected"
    if (low > 0 and expected < 0) or (high < 0 and expected > 0):
        return "against"
    return "unclear"


def verdict(readings: list) -> str:
    """The verdict of one comparison from the readings of its metrics (``side`` of each)."""
    if not readings:
        raise ValueError("verdict: readings must hold at least one metric's reading, got none")
    if all(r == "as expected" for r in readings):
        return "reproduced"
    if all(r == "against" for r in readings):
        return "opposite"
    return "inconclusive"


def compare(a: dict, b: dict, metrics: dict) -> dict:
    """Arm b against arm a. a, b: {metric: {seed: value}}; metrics: {metric: (expected sign, margin)}.
    -> {"metrics": {metric: paired(...) with its "expected" and "reading"}, "verdict"}; the verdict of the
    first metric alone is under each metric's own "verdict" too."""
    out = {}
    for name, (expected, margin) in metrics.items():
        p = paired(a[name], b[name])
        p.update(expected=expected, margin=margin, reading=side(p["ci95"], expected, margin))
        p["verdict"] = verdict([p["reading"]])
        out[name] = p
    return {"metrics": out, "verdict": verdict([m["reading"] for m in out.values()])}


def fmt_diff(p: dict, fmt: str = "+.2f") -> str:
    """'+1.23 [+0.40, +2.06]' for a paired comparison; 'n/a' without an interval."""
    if p["ci95"] is None:
        return "n/a" if p["mean"] is None else f"{p['mean']:{fmt}} (1 seed)"
    return f"{p['mean']:{fmt}} [{p['ci95'][0]:{fmt}}, {p['ci95'][1]:{fmt}}]"


def fmt_mean_sd(values, fmt: str = ".2f") -> str:
    """'12.34 +- 0.56': the mean and the sample SD over seeds."""
    mean, sd = mean_sd(values)
    return f"{mean:{fmt}}" if math.isnan(sd) else f"{mean:{fmt}} +- {sd:{fmt}}"
