"""The paired statistics and verdicts every study derives (experiments/stats.py), on constructed inputs whose
answers are worked out by hand here."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import resumable  # experiments/ is not a package: its scripts import each other by name
import stats


def test_t_quantiles_match_scipy_where_it_is_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in range(1, 31):
        assert stats.t975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=6e-4)


def test_t975_refuses_a_df_below_one():
    with pytest.raises(ValueError, match="df must be an int >= 1, got 0"):
        stats.t975(0)


def test_mean_sd_uses_the_sample_standard_deviation():
    mean, sd = stats.mean_sd([1.0, 2.0, 6.0])
    assert mean == 3.0
    assert sd == pytest.approx(math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2))   # ddof = 1: 14 / 2


def test_paired_differences_and_interval_by_hand():
    a = {0: 10.0, 1: 12.0, 2: 11.0}
    b = {0: 11.0, 1: 15.0, 2: 13.0}                     # differences 1, 3, 2: mean 2, sd 1
    p = stats.paired(a, b)
    assert p["diffs"] == [1.0, 3.0, 2.0] and p["mean"] == 2.0 and p["sd"] == pytest.approx(1.0)
    half = 4.303 / math.sqrt(3)                         # t(0.975, 2) * sd / sqrt(n)
    assert p["ci95"] == pytest.approx([2.0 - half, 2.0 + half])


def test_paired_uses_only_the_seeds_both_arms_have():
    p = stats.paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 5.0, 2: 4.0, 7: 0.0})
    assert p["seeds"] == [1, 2] and p["diffs"] == [3.0, 1.0]


def test_one_seed_gives_no_interval_and_an_inconclusive_verdict():
    c = stats.compare({"m": {0: 1.0}}, {"m": {0: 5.0}}, {"m": (1, 0.0)})
    assert c["metrics"]["m"]["ci95"] is None and c["verdict"] == "inconclusive"


def test_an_interval_crossing_zero_is_inconclusive():
    # differences +1, -1, +3: mean 1, the interval reaches below zero
    c = stats.compare({"m": {0: 0.0, 1: 0.0, 2: 0.0}}, {"m": {0: 1.0, 1: -1.0, 2: 3.0}}, {"m": (1, 0.0)})
    low, high = c["metrics"]["m"]["ci95"]
    assert low < 0 < high and c["verdict"] == "inconclusive"


def test_a_clear_effect_gives_its_direction():
    a = {"m": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}}
    b = {"m": {0: 5.0, 1: 5.2, 2: 4.9, 3: 5.1}}
    assert stats.compare(a, b, {"m": (1, 0.0)})["verdict"] == "reproduced"
    assert stats.compare(a, b, {"m": (-1, 0.0)})["verdict"] == "opposite"
    assert stats.compare(b, a, {"m": (-1, 0.0)})["verdict"] == "reproduced"


def test_metrics_that_disagree_are_inconclusive():
    # perplexity clearly better (lower) and BLEU clearly worse: the claim "better" holds on one metric only
    base = {"bleu": {0: 30.0, 1: 31.0, 2: 29.0}, "ppl": {0: 5.0, 1: 5.1, 2: 4.9}}
    row = {"bleu": {0: 28.0, 1: 29.1, 2: 26.9}, "ppl": {0: 4.5, 1: 4.6, 2: 4.4}}
    c = stats.compare(base, row, {"bleu": (1, 0.0), "ppl": (-1, 0.0)})
    assert c["metrics"]["bleu"]["reading"] == "against" and c["metrics"]["ppl"]["reading"] == "as expected"
    assert c["verdict"] == "inconclusive"
    # the same numbers read against a claim that predicts exactly this trade-off
    assert stats.compare(base, row, {"bleu": (-1, 0.0), "ppl": (-1, 0.0)})["verdict"] == "reproduced"


def test_a_claim_of_no_difference_needs_the_interval_inside_the_margin():
    a = {"m": {0: 0.0, 1: 0.0, 2: 0.0}}
    small = {"m": {0: 0.01, 1: -0.01, 2: 0.0}}
    wide = {"m": {0: 0.5, 1: -0.5, 2: 0.0}}
    shifted = {"m": {0: 1.0, 1: 1.1, 2: 0.9}}
    assert stats.compare(a, small, {"m": (0, 0.1)})["verdict"] == "reproduced"
    assert stats.compare(a, wide, {"m": (0, 0.1)})["verdict"] == "inconclusive"
    assert stats.compare(a, shifted, {"m": (0, 0.1)})["verdict"] == "opposite"
    # clear of zero but reaching into the margin: a difference, perhaps too small to matter, so neither
    nudged = {"m": {0: 0.10, 1: 0.12, 2: 0.08}}                     # interval about [+0.05, +0.15]
    assert stats.compare(a, nudged, {"m": (0, 0.1)})["metrics"]["m"]["reading"] == "unclear"


def test_side_refuses_an_expected_sign_that_is_not_one():
    with pytest.raises(ValueError, match="expected must be -1, 0 or 1, got 2"):
        stats.side([0.0, 1.0], 2)


def test_resumable_runs_only_what_is_missing(tmp_path):
    calls = []

    def fn(job):
        calls.append(job)
        return {"value": job * 10}

    jobs = [("a", 1), ("b", 2), ("c", 3)]
    assert resumable.run_pending(jobs, fn, tmp_path, log=lambda _: None, limit=2) == 2
    assert calls == [1, 2]
    assert resumable.run_pending(jobs, fn, tmp_path, log=lambda _: None) == 1
    assert calls == [1, 2, 3]
    found = resumable.collect(tmp_path, ["a", "b", "c", "d"])
    assert sorted(found) == ["a", "b", "c"] and found["c"]["value"] == 30


def test_resumable_adds_up_the_wall_time_of_the_finished_runs(tmp_path):
    (tmp_path / "finished").mkdir()
    for key, seconds in (("a", 1.5), ("b", 2.0)):
        (tmp_path / "finished" / f"{key}.json").write_text(json.dumps({"wall_seconds": seconds}), encoding="utf-8")
    (tmp_path / "finished" / "c.json").write_text("{}", encoding="utf-8")       # a run that did not record it
    assert resumable.wall_seconds(tmp_path) == 3.5


def test_resumable_passes_over_a_run_a_live_process_claimed_and_takes_over_a_dead_ones(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    claimed = tmp_path / resumable.CLAIMED
    claimed.mkdir()
    (claimed / "a.json").write_text(str(os.getppid()))           # our parent: alive
    (claimed / "b.json").write_text(dead.stdout.strip())          # a process that has exited
    ran, lines = [], []
    assert resumable.run_pending([("a", 1), ("b", 2)], lambda job: ran.append(job) or {}, tmp_path,
                                 log=lines.append) == 1
    assert ran == [2] and any(line.endswith("skip a: another process runs it") for line in lines)
    assert (claimed / "a.json").exists() and not (claimed / "b.json").exists()   # b's claim gone once finished
    assert sorted(resumable.collect(tmp_path, ["a", "b"])) == ["b"]


def test_resumable_refuses_a_key_that_is_not_a_plain_file_name(tmp_path):
    with pytest.raises(ValueError, match=r"run key '\.\./x': expected letters, digits and _\.=\+- only"):
        resumable.key_path(tmp_path, "../x")


# ---------------------------------------------------------------------------------------------- chance

def test_t_two_sided_gives_five_percent_at_the_tabled_quantiles():
    # the 0.975 quantiles (rounded to 3 decimals) leave 5% in the two tails, for every tabled df
    for df in range(1, 31):
        assert stats.t_two_sided(stats.T975[df - 1], df) == pytest.approx(0.05, abs=3e-4), df
    assert stats.t_two_sided(0.0, 4) == 1.0
    assert stats.t_two_sided(1.0, 1) == pytest.approx(0.5)        # Cauchy: P(|T| >= 1) = 1/2
    assert stats.t_two_sided(math.sqrt(2), 2) == pytest.approx(1 - math.sqrt(2) / 2)  # df 2: |t| / sqrt(2 + t^2)


def test_t_two_sided_matches_scipy_where_it_is_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 7, 10, 29):
        for t in (0.1, 1.3, 2.9, 12.0, -4.0):
            assert stats.t_two_sided(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-9, abs=1e-15)


def test_holm_on_hand_worked_p_values():
    # sorted: a 0.01 x 4 = 0.04; c 0.03 x 3 = 0.09; b 0.04 x 2 = 0.08, raised to 0.09; d 0.2 x 1 = 0.2
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.2})
    assert adjusted == pytest.approx({"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.2})
    assert stats.holm({"x": 0.6, "y": 0.7}) == pytest.approx({"x": 1.0, "y": 1.0})     # capped at 1


def _comparison(diffs, expected=1, margin=0.0):
    return stats.compare({"m": {s: 0.0 for s in range(len(diffs))}}, {"m": dict(enumerate(diffs))},
                         {"m": (expected, margin)})


def test_p_value_agrees_with_the_interval():
    # mean 1, sd 1, n 5: t = sqrt(5) = 2.236 < 2.776, interval across zero, p above 0.05; mean 2: t = 4.47
    crossing, clear = _comparison([0, 1, 2, 0, 2]), _comparison([1, 2, 3, 1, 3])
    assert crossing["verdict"] == "inconclusive" and stats.p_value(crossing["metrics"]["m"]) > 0.05
    assert clear["verdict"] == "reproduced" and stats.p_value(clear["metrics"]["m"]) < 0.05
    assert stats.p_value(clear["metrics"]["m"], "against") == 1.0         # the mean is on the claimed side
    # no difference within +-1: mean 0.2, se 0.2 (sd sqrt(0.2)); (1 - 0.2) / 0.2 = 4 standard errors inside
    alike = _comparison([0.2 + d for d in (-0.5, 0.5, 0.0, 0.3, -0.3)], expected=0, margin=1.0)
    se = stats.mean_sd(alike["metrics"]["m"]["diffs"])[1] / math.sqrt(5)
    assert stats.p_value(alike["metrics"]["m"]) == pytest.approx(stats.t_two_sided((1 - 0.2) / se, 4))


def test_correct_leaves_inconclusive_what_holm_does_not_keep():
    # clear comparisons and a marginal one, reproduced alone at 95%, kept by Holm while it is the only marginal one
    strong = [10, 11, 12, 10, 11]
    marginal = [0.5, 2.0, 1.0, 0.2, 2.3]          # t = 1.2 / (0.91 / sqrt 5) = 2.95: p 0.042, reproduced alone
    family = {"s1": _comparison(strong), "s2": _comparison(strong), "m": _comparison(marginal)}
    assert family["m"]["verdict"] == "reproduced"
    stats.correct(family)
    assert family["m"]["p"] == pytest.approx(stats.p_value(family["m"]["metrics"]["m"]))
    assert family["m"]["p_holm"] == pytest.approx(family["m"]["p"])           # the largest p: times 1
    assert family["m"]["verdict_holm"] == "reproduced"                        # 0.042 < 0.05
    family["s3"], family["s4"] = _comparison(strong), _comparison(strong)
    stats.correct(family)
    assert family["m"]["verdict_holm"] == "reproduced"                        # still the last of the order
    family["x"] = _comparison([0.5, 2.0, 1.0, 0.2, 2.31])                     # a second marginal one
    stats.correct(family)
    low, high = sorted((family["m"]["p"], family["x"]["p"]))
    assert family["m"]["p_holm"] == pytest.approx(max(2 * low, high))       # the smaller of the two times 2
    assert family["m"]["verdict_holm"] == "inconclusive" and family["m"]["verdict"] == "reproduced"


def test_an_arm_pair_at_its_bound_reads_at_ceiling():
    a = {"acc": {0: 1.0, 1: 1.0, 2: 0.999}}
    b = {"acc": {0: 0.998, 1: 0.997, 2: 0.996}}
    bounds = {"acc": ("ceiling", 1.0, 0.005)}
    c = stats.compare(a, b, {"acc": (-1, 0.0)}, bounds)
    assert c["metrics"]["acc"]["means"] == pytest.approx([0.999666, 0.997], abs=1e-5)
    assert c["verdict"] == "at ceiling"
    far = stats.compare(a, {"acc": {0: 0.9, 1: 0.91, 2: 0.92}}, {"acc": (-1, 0.0)}, bounds)
    assert far["verdict"] == "reproduced"                                    # one arm away from the bound
    stats.correct({"c": c})
    assert c["verdict_holm"] == "at ceiling"


def test_shown_names_the_quantity_the_confound_the_tuning_and_the_source():
    assert stats.shown("reproduced", {"quantity": "learning speed"}) == "same direction"
    assert stats.shown("inconclusive", {"quantity": "learning speed"}) == "inconclusive"
    assert stats.shown("reproduced", {"confound": "4x the rate"}) == "confounded (4x the rate)"
    assert stats.shown("reproduced", {"confound": "4x", "quantity": "speed"}) == "confounded (4x)"
    assert stats.shown("reproduced", {"untuned": True}) == "reproduced, untuned"
    assert stats.shown("opposite", {"source": "Xiong et al. 2020"}) == "opposite [Xiong et al. 2020]"


# ---------------------------------------------------------------------------------------------- protocols

def test_a_changed_protocol_makes_a_new_run(tmp_path, monkeypatch):
    # a resumable study's runs live under its protocol's sha256: edit the protocol and the next run starts afresh
    import types

    import common

    monkeypatch.setattr(common, "PROTOCOLS", tmp_path)
    calls = []

    def make(text):
        (tmp_path / "fake.json").write_text(text, encoding="utf-8")
        protocol = common.protocol("fake")
        module = types.SimpleNamespace(NAME="fake", __doc__="A fake study.", PROTOCOL=protocol, RESUMABLE=True,
                                       SETTINGS=protocol["settings"], QUICK={}, figures=lambda payload: {})

        def run(s, progress=True, folder=None):
            calls.append(folder)
            runs = resumable.run_pending([("one", s)], lambda job: {"x": job["x"]}, folder)
            return {"ran": runs}

        module.run = run
        return module

    out = tmp_path / "out"
    first = make('{"settings": {"x": 1}}')
    common.main(first, ["--out", str(out), "--no-progress"])
    common.main(first, ["--out", str(out), "--no-progress"])
    second = make('{"settings": {"x": 1}, "tuning": "another rule"}')
    common.main(second, ["--out", str(out), "--no-progress"])
    stored = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert first.PROTOCOL["sha256"] != second.PROTOCOL["sha256"]
    assert calls == [out / f"runs-{first.PROTOCOL['sha256'][:12]}"] * 2 + [out / f"runs-{second.PROTOCOL['sha256'][:12]}"]
    assert stored["protocol"] == {"file": "protocols/fake.json", "sha256": second.PROTOCOL["sha256"]}
    assert stored["results"]["ran"] == 1                         # the new protocol ran its run again
    import hashlib
    assert second.PROTOCOL["sha256"] == hashlib.sha256((tmp_path / "fake.json").read_bytes()).hexdigest()


def test_every_study_reads_its_protocol():
    import common

    for path in sorted(common.PROTOCOLS.glob("*.json")):
        p = common.protocol(path.stem)
        for field in ("study", "question", "source", "arms", "seeds", "tuning", "metrics", "verdict", "settings"):
            assert field in p, (path.name, field)
        if isinstance(p["tuning"], dict):
            assert not set(p["settings"]["seeds"]) & set(p["settings"]["tune_seeds"]), path.name
