"""Paired comparisons over seeds, and the verdict each study derives from them.

A study trains every arm with the same seeds, so arm B's run with seed s is paired with arm A's run with seed s
(the same initialisation stream and batch order): the per-seed differences B - A carry the effect without the
seed-to-seed spread the two arms share. For n seeds:

    mean     the mean of the n differences
    sd       their sample standard deviation (ddof = 1: the n - 1 of an estimate from a sample)
    ci95     mean -+ t(0.975, n - 1) * sd / sqrt(n), Student's t with n - 1 degrees of freedom

A claim is one or more metrics, each with the sign the paper expects of B - A: +1 (B higher), -1 (B lower) or 0
(no difference within -+ a margin the study states). Each metric's reading (``side``):

    as expected    sign +-1: the interval excludes zero on the expected side (low > 0 for +1, high < 0 for -1);
                   sign 0: the interval lies inside [-margin, +margin]
    against        sign +-1: the interval excludes zero on the other side;
                   sign 0: the interval lies wholly outside [-margin, +margin] (low > margin or high < -margin);
                   an interval that excludes zero but reaches into the margin is not against "no difference"
    unclear        anything else, or fewer than 2 seeds
    at ceiling     (or at floor) the study states a bound for the metric (a maximum such as accuracy 1, a minimum
                   such as loss 0 or the first evaluation's step) and a distance, and both arms' means over the
                   paired seeds lie within that distance of it: the difference says little about the arms

The verdict of one comparison, from its metrics' readings:

    at ceiling / at floor   any metric at its bound (the first such metric names it)
    reproduced              every metric as expected
    opposite                every metric against
    inconclusive            anything else: an interval crossing zero, or metrics that disagree (perplexity better
                            and BLEU worse, say)

Chance: a study makes several comparisons, each at 95%. Each comparison gets a p-value: per metric, the smallest
level alpha at which its (1 - alpha) Student's t interval would still give the reading (``p_value``), and for the
comparison the largest of its metrics' (every metric must agree: an intersection-union test); Holm's step-down
correction (``holm``) then adjusts these over the study's complete comparisons, and ``correct`` stores "p",
"p_holm" and "verdict_holm": the verdict where p_holm < 0.05 for "reproduced" and "opposite", "inconclusive"
where it is not; the other verdicts unchanged. Holm keeps the chance of one or more false "reproduced" or
"opposite" in a study at 5% or below, whatever the dependence between its comparisons.

How a verdict is shown (``shown``): on a quantity other than the paper's, "reproduced" reads "same direction"
(and "opposite", "opposite direction"); one whose arms differ in more than the compared choice reads "confounded
(...)", naming the confound; a comparison whose rates were not tuned adds ", untuned"; a claim the paper does not
make names its source in brackets.
"""

from __future__ import annotations

import math

# Student's t, the 0.975 quantile, for 1..30 degrees of freedom (beyond 30 the normal's 1.96 is within 2%).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

VERDICTS = ("reproduced", "opposite", "inconclusive", "at ceiling", "at floor")
ALPHA = 0.05                                   # the family-wise level of the Holm correction


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"t975: df must be an int >= 1, got {df!r}")
    return T975[df - 1] if df <= len(T975) else 1.96


def t_two_sided(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom, from the closed form in theta = atan(|t| /
    sqrt(df)): A = P(|T| < |t|) = (2 / pi) (theta + sin theta (cos theta + 2/3 cos^3 theta + ...)) for odd df,
    sin theta (1 + 1/2 cos^2 theta + 3/8 cos^4 theta + ...) for even df (Abramowitz and Stegun 26.7.3-4)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"t_two_sided: df must be an int >= 1, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:
        term, total = c, 0.0
        for j in range(1, (df - 1) // 2 + 1):         # df = 1: no terms
            total += term
            term *= c * c * (2 * j) / (2 * j + 1)
        inside = 2 / math.pi * (theta + s * total)
    else:
        term, total = 1.0, 0.0
        for j in range(1, df // 2 + 1):
            total += term
            term *= c * c * (2 * j - 1) / (2 * j)
        inside = s * total
    return min(1.0, max(0.0, 1.0 - inside))


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
    """The verdict of one comparison from the readings of its metrics (``side`` of each, or "at ceiling" /
    "at floor")."""
    if not readings:
        raise ValueError("verdict: readings must hold at least one metric's reading, got none")
    for r in readings:
        if r in ("at ceiling", "at floor"):
            return r
    if all(r == "as expected" for r in readings):
        return "reproduced"
    if all(r == "against" for r in readings):
        return "opposite"
    return "inconclusive"


def compare(a: dict, b: dict, metrics: dict, bounds: dict | None = None) -> dict:
    """Arm b against arm a. a, b: {metric: {seed: value}}; metrics: {metric: (expected sign, margin)}; bounds:
    {metric: ("ceiling" or "floor", the bound, the distance)}, optional per metric.
    -> {"metrics": {metric: paired(...) with its "expected", "margin", "means" (a's and b's over the paired seeds),
    "reading" and its own "verdict"}, "verdict"}"""
    out = {}
    for name, (expected, margin) in metrics.items():
        p = paired(a[name], b[name])
        p.update(expected=expected, margin=margin, reading=side(p["ci95"], expected, margin),
                 means=[mean_sd([arm[name][s] for s in p["seeds"]])[0] if p["seeds"] else None for arm in (a, b)])
        kind, bound, distance = (bounds or {}).get(name, (None, None, None))
        if kind is not None and p["seeds"] and all(abs(m - bound) <= distance for m in p["means"]):
            p["reading"] = f"at {kind}"
        p["verdict"] = verdict([p["reading"]])
        out[name] = p
    return {"metrics": out, "verdict": verdict([m["reading"] for m in out.values()])}


def p_value(p: dict, toward: str = "as expected") -> float:
    """The smallest level alpha at which a metric's (1 - alpha) interval would give the reading ``toward`` ("as
    expected" or "against"): the two-sided p of how far its mean clears zero (sign +-1) or the margin (sign 0) on
    that side, in standard errors; 1 where the mean is not on that side or fewer than 2 seeds were paired."""
    if p["ci95"] is None:
        return 1.0
    mean, sd, n, sign, margin = p["mean"], p["sd"], len(p["diffs"]), p["expected"], p["margin"]
    if sign == 0:
        gap = margin - abs(mean) if toward == "as expected" else abs(mean) - margin
    else:
        gap = sign * mean if toward == "as expected" else -sign * mean
    if gap <= 0:
        return 1.0
    return 0.0 if sd == 0 else t_two_sided(gap / (sd / math.sqrt(n)), n - 1)


def holm(pvalues: dict) -> dict:
    """Holm's adjusted p-values {name: p}: the i-th smallest (i from 0, of m) times m - i, never below the one
    before it, at most 1."""
    out, running = {}, 0.0
    for i, name in enumerate(sorted(pvalues, key=pvalues.get)):
        running = max(running, min(1.0, (len(pvalues) - i) * pvalues[name]))
        out[name] = running
    return out


def correct(comparisons: dict, alpha: float = ALPHA) -> dict:
    """Holm over a study's complete comparisons (those without a "status" other than "complete"): adds "p",
    "p_holm" and "verdict_holm" to each, in place. -> comparisons"""
    family = {name: c for name, c in comparisons.items() if c.get("status", "complete") == "complete"}
    for c in family.values():
        towards = {"reproduced": ["as expected"], "opposite": ["against"]}.get(c["verdict"], ["as expected", "against"])
        c["p"] = min(max(p_value(m, toward) for m in c["metrics"].values()) for toward in towards)
    for name, p_holm in holm({name: c["p"] for name, c in family.items()}).items():
        c = family[name]
        c["p_holm"] = p_holm
        c["verdict_holm"] = c["verdict"] if c["verdict"] not in ("reproduced", "opposite") or p_holm < alpha \
            else "inconclusive"
    return comparisons


def shown(verdict_: str, c: dict) -> str:
    """A verdict as the tables show it: "same direction" for "reproduced" where the comparison measures another
    quantity than the paper's (c["quantity"]), "confounded (...)" for "reproduced" or "opposite" where a difference
    between the arms other than the one compared may carry the effect (c["confound"]), ", untuned" where its rates
    were not tuned (c["untuned"]), and the source of a claim the paper does not make in brackets (c["source"])."""
    if c.get("confound") and verdict_ in ("reproduced", "opposite"):
        verdict_ = f"confounded ({c['confound']})"
    if c.get("quantity") and verdict_ in ("reproduced", "opposite"):
        verdict_ = {"reproduced": "same direction", "opposite": "opposite direction"}[verdict_]
    if c.get("untuned"):
        verdict_ += ", untuned"
    return verdict_ + (f" [{c['source']}]" if c.get("source") else "")


def fmt_diff(p: dict, fmt: str = "+.2f") -> str:
    """'+1.23 [+0.40, +2.06]' for a paired comparison; 'n/a' without an interval."""
    if p["ci95"] is None:
        return "n/a" if p["mean"] is None else f"{p['mean']:{fmt}} (1 seed)"
    return f"{p['mean']:{fmt}} [{p['ci95'][0]:{fmt}}, {p['ci95'][1]:{fmt}}]"


def fmt_mean_sd(values, fmt: str = ".2f") -> str:
    """'12.34 +- 0.56': the mean and the sample SD over seeds."""
    mean, sd = mean_sd(values)
    return f"{mean:{fmt}}" if math.isnan(sd) else f"{mean:{fmt}} +- {sd:{fmt}}"
