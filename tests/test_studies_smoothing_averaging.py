"""The label-smoothing and checkpoint-averaging studies (experiments/label_smoothing.py, averaging.py): each runs
from one command with --quick and writes a JSON of sane figures and its plots; the helpers they add are right
on cases whose answer is known."""

import math
import sys
from pathlib import Path

import numpy as np
from test_experiments import run_script  # tests/ is on sys.path under pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import averaging  # experiments/ is not a package: its scripts import each other by name
import label_smoothing
import training


def test_label_smoothing_quick(tmp_path):
    payload = run_script("label_smoothing", tmp_path)
    s, res = payload["settings"], payload["results"]
    assert len(res["runs"]) == len(s["epsilons"]) * len(s["seeds"])
    tokens = None
    for r in res["runs"]:
        assert [m["steps"] for m in r["at"]] == s["budgets"]
        for m in r["at"]:
            assert 1.0 < m["ppl"] < 10_000 and 0.0 <= m["bleu"] <= 100.0
            assert 0.0 <= m["token_accuracy"] <= 1.0 and 0.0 <= m["ece"] <= 1.0
            assert len(m["count"]) == s["bins"]
            tokens = tokens or sum(m["count"])
            assert sum(m["count"]) == tokens            # every run is measured on the same validation tokens
    assert len(res["table"]) == len(s["budgets"]) * len(s["epsilons"])
    assert all(("minus_baseline" in row) == (row["epsilon"] != s["epsilons"][0]) for row in res["table"])
    for name in ("reliability", "metrics"):
        assert (tmp_path / f"label_smoothing_{name}.png").stat().st_size > 0
    # every comparison carries its per-seed differences, recomputable from the runs
    assert len(res["comparisons"]) == 3 * len(s["budgets"]) * (len(s["epsilons"]) - 1)
    for name, c in res["comparisons"].items():
        budget = s["budgets"].index(int(name.split(", ")[1].split()[0]))
        for metric, m in c["metrics"].items():
            assert m["diffs"] == label_smoothing.paired_differences(res["runs"], metric, budget, s["epsilons"][1])


def test_label_smoothing_reads_each_part_of_the_claim():
    # eps 0.1 raises perplexity on every seed by about the same, BLEU by amounts that straddle zero
    runs = [{"epsilon": e, "seed": seed, "at": [{"ppl": 1.0 + e + 0.01 * seed * e, "bleu": 70 + e * [30, -40, 20][seed],
                                                  "token_accuracy": 0.9}]}
            for seed in range(3) for e in (0.0, 0.1)]
    c = label_smoothing.comparisons(runs, {"epsilons": [0.0, 0.1], "budgets": [300]})
    assert c["eps 0.1 - eps 0, 300 steps: hurts perplexity"]["verdict"] == "reproduced"
    assert c["eps 0.1 - eps 0, 300 steps: improves BLEU"]["verdict"] == "inconclusive"
    assert c["eps 0.1 - eps 0, 300 steps: improves accuracy"]["verdict"] == "inconclusive"   # no change at all
    for r in runs:                                                  # perplexity now falls on every seed
        r["at"][0]["ppl"] = 1.0 - r["epsilon"] - 0.01 * r["seed"] * r["epsilon"]
    c = label_smoothing.comparisons(runs, {"epsilons": [0.0, 0.1], "budgets": [300]})
    assert c["eps 0.1 - eps 0, 300 steps: hurts perplexity"]["verdict"] == "opposite"


def test_training_on_through_budgets_equals_one_run():
    # the study measures a run at several budgets by training on from each: it must be the run itself
    settings = training.settings_for("toy", steps=6, seed=3)
    stepped = label_smoothing.train_through(settings, [3, 6], lambda trainer, data: trainer.model.state_dict())
    once, _ = training.train(settings)
    assert len(stepped) == 2
    for name, value in once.model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(stepped[1][name]), np.asarray(value), err_msg=name)
    assert any(not np.array_equal(np.asarray(stepped[0][n]), np.asarray(v))
               for n, v in once.model.state_dict().items())    # step 3 is another model


def test_pooled_reliability_weights_every_token_once():
    # a: 1 token at confidence 0.15 (wrong), 3 tokens at 0.95 (all right); b: 1 at 0.85 (right), 1 at
    # 0.95 (wrong). Pooled by hand: bin 1 {0.15: 0}, bin 8 {0.85: 1}, bin 9 {0.95 x4: 3 right}.
    a = {"count": [0, 1, 0, 0, 0, 0, 0, 0, 0, 3], "confidence": [math.nan, 0.15] + [math.nan] * 7 + [0.95],
         "accuracy": [math.nan, 0.0] + [math.nan] * 7 + [1.0]}
    b = {"count": [0] * 8 + [1, 1], "confidence": [math.nan] * 8 + [0.85, 0.95],
         "accuracy": [math.nan] * 8 + [1.0, 0.0]}
    pooled = label_smoothing.pooled_reliability([a, b])
    assert pooled["count"] == [0, 1, 0, 0, 0, 0, 0, 0, 1, 4]
    np.testing.assert_allclose(pooled["confidence"][9], 0.95)
    np.testing.assert_allclose(pooled["accuracy"], [math.nan, 0.0] + [math.nan] * 6 + [1.0, 0.75])
    # ECE = (1 * |0 - 0.15| + 1 * |1 - 0.85| + 4 * |0.75 - 0.95|) / 6
    np.testing.assert_allclose(pooled["ece"], (0.15 + 0.15 + 0.8) / 6)


def test_paired_differences_pair_by_seed():
    runs = [{"epsilon": e, "seed": s, "at": [{"bleu": 10 * s + 100 * e}]} for s in (2, 0, 1) for e in (0.0, 0.1)]
    np.testing.assert_allclose(label_smoothing.paired_differences(runs, "bleu", 0, 0.1), [10.0] * 3)


def test_averaging_quick(tmp_path):
    payload = run_script("averaging", tmp_path)
    s, res = payload["settings"], payload["results"]
    assert [r["seed"] for r in res["runs"]] == s["seeds"]
    for r in res["runs"]:
        assert r["steps"] == s["steps"]
        for b in s["budgets"]:
            for m in s["averages"]:
                assert 0.0 <= r["bleu"][str(b)][str(m)] <= 100.0
                # evaluate averaged the last m files written up to step b, a file every save_every steps
                assert r["averaged_steps"][str(b)][str(m)] == [b - k * s["save_every"] for k in range(m)][::-1]
                assert 1.0 <= r["ppl"][str(b)][str(m)] < 10_000            # exp(mean NLL): at least 1, finite
        # the last file alone is the model the train command scored at its end
        np.testing.assert_allclose(r["bleu"][str(s["steps"])]["1"], r["train_bleu_at_end"], rtol=1e-9)
        assert r["curve"]["step"][-1] == s["steps"] and r["curve"]["bleu"][-1] == r["train_bleu_at_end"]
    assert (tmp_path / "averaging_bleu.png").stat().st_size > 0


def test_averaging_helps_only_when_bleu_rises_and_perplexity_falls():
    s = {"budgets": [600], "averages": [1, 5]}

    def runs(bleu_gains, ppl_gains):
        return [{"seed": seed, "bleu": {"600": {"1": 90.0, "5": 90.0 + g}}, "ppl": {"600": {"1": 1.5, "5": 1.5 + p}}}
                for seed, (g, p) in enumerate(zip(bleu_gains, ppl_gains))]

    verdict = lambda r: averaging.comparisons(r, s)["last 5 - last 1, 600 steps"]["verdict"]
    assert verdict(runs([1.0, 1.2, 0.9], [-0.02, -0.025, -0.018])) == "reproduced"
    assert verdict(runs([1.0, 1.2, 0.9], [0.02, 0.025, 0.018])) == "inconclusive"       # the two metrics disagree
    assert verdict(runs([-1.0, -1.2, -0.9], [0.02, 0.025, 0.018])) == "opposite"
    assert verdict(runs([1.0, -1.2, 0.9], [-0.02, -0.025, -0.018])) == "inconclusive"   # BLEU's interval crosses 0


def test_gains_are_average_minus_last_per_seed():
    runs = [{"bleu": {"600": {"1": 90.0, "5": 92.5}}}, {"bleu": {"600": {"1": 95.0, "5": 94.0}}}]
    assert averaging.gains(runs, 600, 5) == [2.5, -1.0]
    assert averaging.gains(runs, 600, 1) == [0.0, 0.0]
