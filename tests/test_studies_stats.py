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
