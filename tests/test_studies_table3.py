"""The Table 3 studies (experiments/table3.py, multi30k_table3.py) and the measurements every study of
experiments/training.py takes.

The measurements are checked on stand-in models whose answer is known by hand: a model that always gives the
same logits has a perplexity and a calibration that follow from those logits alone.
"""

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import table3  # experiments/ is not a package: its scripts import each other by name
import training
from test_experiments import pngs, run_script

from minitransformer.kit.data.task_data import TRANSLATION_MAX_LEN
from minitransformer.kit.running.settings import check_saved_settings


class FixedLogits:
    """A stand-in model: the same logits (V,) at every target position, whatever the input."""

    def __init__(self, logits):
        self.logits = np.asarray(logits, dtype=np.float64)

    def __call__(self, src, tgt_in):
        return np.broadcast_to(self.logits, (*np.shape(tgt_in), self.logits.size)).copy()


def batch_of(tgt_out, pad_id=0):
    tgt_out = np.asarray(tgt_out)
    return (np.ones((tgt_out.shape[0], 2), dtype=np.int64), np.ones_like(tgt_out), tgt_out)


def test_true_perplexity_is_exp_of_the_mean_nll_over_non_pad_tokens():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))              # a normalised distribution over 4 ids
    batches = [batch_of([[1, 2, 0], [3, 3, 3]]), batch_of([[2, 0, 0]])]
    kept = [1, 2, 3, 3, 3, 2]                                      # the non-pad targets (pad id 0)
    expected = math.exp(-np.mean(np.log(np.array([0.1, 0.2, 0.3, 0.4])[kept])))
    assert training.true_perplexity(FixedLogits(logits), batches) == pytest.approx(expected, rel=1e-12)


def test_token_calibration_bins_confidence_against_accuracy():
    p = np.array([0.05, 0.05, 0.7, 0.2])                            # always predicts id 2 with confidence 0.7
    batches = [batch_of([[2, 2, 1, 0], [3, 2, 0, 0]])]              # 5 real tokens, id 2 right 3 times
    c = training.token_calibration(FixedLogits(np.log(p)), batches, bins=10)
    assert c["count"] == [0] * 7 + [5, 0, 0]                        # 0.7 falls in the bin [0.7, 0.8)
    assert c["confidence"][7] == pytest.approx(0.7) and c["accuracy"][7] == pytest.approx(0.6)
    assert c["token_accuracy"] == pytest.approx(0.6) and c["mean_confidence"] == pytest.approx(0.7)
    assert c["ece"] == pytest.approx(0.1)
    assert all(math.isnan(v) for i, v in enumerate(c["accuracy"]) if i != 7)


def test_settings_for_changes_the_model_or_the_run_and_refuses_an_unknown_name():
    s = training.settings_for("toy", d_k=5, d_v=9, positional="learned", label_smoothing=0.2, steps=7)
    assert s["model"]["d_k"] == 5 and s["model"]["d_v"] == 9 and s["model"]["positional"] == "learned"
    # what a saved run holds is what evaluate and resume accept back
    assert check_saved_settings(s, "toy", "here", complete=True)["model"]["d_v"] == 9
    assert s["label_smoothing"] == 0.2 and s["steps"] == 7 and s["progress"] is False
    with pytest.raises(ValueError, match="unknown setting 'heads'"):
        training.settings_for("toy", heads=2)


@pytest.mark.parametrize("name", list(table3.ROWS))
def test_each_row_changes_what_it_names_and_nothing_else(name):
    settings = table3.row_settings("toy", name, seed=0, factor=1.0, steps=3)
    base = table3.row_settings("toy", "base", seed=0, factor=1.0, steps=3)
    changes = {k: v for k, v in table3.ROWS[name][1].items() if k != "position_std"}   # not a setting: see below
    changed = {k for k in {*settings, *settings["model"]} - {"model"}
               if settings.get(k, settings["model"].get(k)) != base.get(k, base["model"].get(k))}
    if "num_encoder_layers" in changes:                              # N counts the layers of both stacks
        changes = {**changes, "num_decoder_layers": changes["num_encoder_layers"]}
    assert changed == {k for k, v in changes.items() if table3.BASE.get(k) != v or k == "num_decoder_layers"}
    for key, value in changes.items():
        assert settings["model"].get(key, settings.get(key)) == value
    if table3.ROWS[name][0] == "A":                                  # fixed computation: h * d_k as in the base
        assert changes["num_heads"] * changes["d_k"] == table3.BASE["num_heads"] * table3.BASE["d_k"]
    if "d_v" in changes:                                             # keys alone: the values keep the base's size
        assert changes["d_v"] == table3.BASE["d_k"] and changes["d_k"] < table3.BASE["d_k"]


def test_the_rate_factor_is_the_runs_own():
    assert table3.row_settings("toy", "h=1", seed=0, factor=2.0, steps=3)["lr_factor"] == 2.0


def test_scale_positions_gives_the_learned_tables_the_asked_spread():
    import minitransformer as mt

    config = mt.TransformerConfig.preset("tiny", src_vocab_size=30, tgt_vocab_size=30, positional="learned")
    model = mt.Transformer(config)
    before = {n: np.array(p.data) for n, p in model.named_parameters()}
    table3.scale_positions(model, 0.7)
    for name, p in model.named_parameters():
        if name.endswith("_pos.P"):
            assert float(np.std(p.data)) == pytest.approx(0.7, rel=1e-6)
        else:
            np.testing.assert_array_equal(p.data, before[name], err_msg=name)


SMALL = {"smooth": 3, "target": 90.0, "at_step": 300, "eval_every": 25, "max_steps": 1500}


def curve_of(bleus, start=25):
    return [[start + 25 * k, b, 2.0] for k, b in enumerate(bleus)]


def test_one_lucky_checkpoint_does_not_reach_the_target():
    # a single evaluation at 95 between two at 70: the moving mean of 3 stays at 78.3
    assert table3.measures(curve_of([60, 70, 95, 70, 80]), SMALL)["steps"] is None
    # three in a row whose mean reaches 90: the step of the third
    m = table3.measures(curve_of([60, 70, 95, 88, 91, 93]), SMALL)
    assert m["steps"] == 25 * 5                      # evaluations at 75, 100, 125 -> (95 + 88 + 91) / 3 = 91.3


def test_measures_around_the_step_of_the_table():
    curve = [[s, float(s) / 10, 1.0 + s / 1000] for s in range(25, 401, 25)]
    m = table3.measures(curve, SMALL)
    assert m["bleu_at"] == pytest.approx((27.5 + 30 + 32.5) / 3)       # steps 275, 300, 325
    assert m["ppl_at"] == pytest.approx(1.3)


def test_choose_factor_keeps_the_default_unless_another_is_faster_by_more_than_the_resolution():
    s = {"max_steps": 100, "eval_every": 25, "factors": [0.5, 1.0, 2.0], "resolution": 25}

    def tuned(steps):        # {factor: [steps on each tuning seed]}
        return [{"factor": f, "steps": x} for f, xs in steps.items() for x in xs]

    # 2 is faster than 1 by 25 on the mean (one evaluation): within the resolution, so the default
    assert table3.choose_factor(tuned({0.5: [None, None], 1.0: [75, 75], 2.0: [50, 50]}), s) == 1.0
    # by 37.5: beyond it
    assert table3.choose_factor(tuned({0.5: [None, None], 1.0: [75, 100], 2.0: [50, 50]}), s) == 2.0
    # 0.5 and 2 both beyond, within 25 of each other: the nearer 1 in ratio is a tie, then the smaller
    assert table3.choose_factor(tuned({0.5: [25, 50], 1.0: [100, 100], 2.0: [50, 50]}), s) == 0.5
    assert table3.steps_or_censored({"steps": None}, s) == 125       # never reached: counted past the limit


def test_processes_sharing_the_study_start_a_rows_seeds_only_after_all_its_tuning(tmp_path, monkeypatch):
    """One tuning run of a row is held by another live process: this process runs the rest of the tuning, then
    waits rather than start the seeds at a factor chosen from part of the tuning; once the held run has finished
    (here: at a factor that changes the choice), the seeds run at the factor all the tuning chooses."""
    s = {**table3.QUICK, "rows": ["base"], "tune_seeds": [100, 101]}
    ran = []

    def fake_run(job):
        ran.append((job["seed"], job["factor"]))
        return {"row": job["row"], "seed": job["seed"], "factor": job["factor"], "steps": 8}

    def interrupt(seconds):
        raise TimeoutError("waited")

    monkeypatch.setattr(table3, "run_one", fake_run)
    monkeypatch.setattr(table3.time, "sleep", interrupt)
    held = table3.tuning_jobs(s, "base")[0]              # factor 0.5 on seed 100
    (tmp_path / "claimed").mkdir()
    (tmp_path / "claimed" / f"{held[0]}.json").write_text(str(os.getppid()))   # a live process, not this one
    with pytest.raises(TimeoutError, match="waited"):
        table3.run_study(s, tmp_path, log=lambda line: None)
    assert sorted(ran) == [(100, 1.0), (101, 0.5), (101, 1.0)]                 # tuning only, no seed 0 or 1
    (tmp_path / "finished" / f"{held[0]}.json").write_text(json.dumps({"key": held[0], "row": "base", "seed": 100,
                                                                        "factor": 0.5, "steps": 2}))
    (tmp_path / "claimed" / f"{held[0]}.json").unlink()
    ran.clear()
    table3.run_study(s, tmp_path, log=lambda line: None)
    assert ran == [(0, 0.5), (1, 0.5)]           # 0.5: mean 5 steps against 8, faster by more than the resolution
    stored = table3.resumable.collect(tmp_path, [k for k, _ in table3.seed_jobs(s, "base", 0.5)])
    assert [r["factor"] for r in stored.values()] == [0.5, 0.5]


def test_seed_runs_at_another_factor_than_the_tuning_chooses_are_refused(tmp_path):
    s = {**table3.QUICK, "rows": ["base"]}
    (tmp_path / "finished").mkdir()
    for key, job in table3.tuning_jobs(s, "base") + table3.seed_jobs(s, "base", 0.5):
        run = {"key": key, "row": "base", "seed": job["seed"], "factor": job["factor"], "steps": 8,
               "ppl_at": 2.0, "bleu_at": 50.0, "params": 1, "curve": []}
        (tmp_path / "finished" / f"{key}.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match=r"base-s0, base-s1 ran at another rate factor than the tuning chooses \(1\)"):
        table3.aggregate(s, tmp_path)


def test_table3_quick_resumes_and_compares(tmp_path):
    p = run_script("table3", tmp_path)
    s, res = p["settings"], p["results"]
    assert pngs(tmp_path) == ["table3_curves.png"]
    assert set(res["table"]) == set(s["rows"]) and res["pending_rows"] == []
    for name, row in res["table"].items():
        assert row["factor"] in s["factors"] and row["seeds"] == s["seeds"]
        assert len(row["tuning"]) == len(s["factors"])
    assert "protocol" not in p                                      # a quick run follows no protocol file
    for run in res["runs"]:
        steps = [c[0] for c in run["curve"]]
        assert steps == list(range(s["eval_every"], steps[-1] + 1, s["eval_every"]))
        assert all(c[2] > 1 and 0 <= c[1] <= 100 for c in run["curve"])
    # h = 1 at d_k = d_model has the base's parameters (fixed h * d_k); learned positions add a table per side
    table = res["table"]
    assert table["h=1"]["params"] == table["base"]["params"]
    learned = next(n for n in s["rows"] if n.startswith("learned"))
    assert table[learned]["params"] - table["base"]["params"] == 2 * TRANSLATION_MAX_LEN * table3.BASE["d_model"]
    # keys alone: only W_q and W_k (weights and biases) narrow, in each of the N + 2N attentions; W_v and W_o stay
    keys_only = next(n for n in s["rows"] if "d_v" in table3.ROWS[n][1])
    fewer = table3.BASE["d_k"] - table3.ROWS[keys_only][1]["d_k"]
    attentions = 3 * table3.BASE["num_encoder_layers"]
    per_attention = 2 * (table3.BASE["d_model"] + 1) * table3.BASE["num_heads"] * fewer
    assert table["base"]["params"] - table[keys_only]["params"] == attentions * per_attention
    for name, c in res["comparisons"].items():
        assert c["status"] == "complete"
        diffs = c["metrics"]["steps"]["diffs"]
        by_seed = {r["seed"]: table3.steps_or_censored(r, s) for r in res["runs"] if r["row"] == name}
        base = {r["seed"]: table3.steps_or_censored(r, s) for r in res["runs"] if r["row"] == "base"}
        assert diffs == [by_seed[k] - base[k] for k in sorted(base)]
    # a second invocation finds every run finished and trains nothing
    finished = sorted(tmp_path.glob("runs-*/finished/*.json"))
    assert len(finished) == len(s["rows"]) * (len(s["factors"]) * len(s["tune_seeds"]) + len(s["seeds"]))
    stamps = [f.stat().st_mtime_ns for f in finished]
    run_script("table3", tmp_path)
    assert [f.stat().st_mtime_ns for f in finished] == stamps


def test_multi30k_table3_quick_resumes(tmp_path):
    import multi30k_table3

    p = run_script("multi30k_table3", tmp_path)
    s, res = p["settings"], p["results"]
    assert res["pending"] == [] and len(res["runs"]) == len(s["rows"]) * len(s["seeds"])
    for run in res["runs"]:
        assert run["steps"] == s["steps"] and 0 <= run["test_bleu"] <= 100 and run["test_ppl"] > 1
        assert run["averaged"]["steps"] == [s["steps"] - k * s["save_every"] for k in range(s["average"])][::-1]
        assert 0 <= run["averaged"]["test_bleu"] <= 100 and run["averaged"]["test_ppl"] > 1
    assert not any((tmp_path / "runs").glob("*/*.npz"))               # the scratch checkpoints are removed
    model = multi30k_table3.task_model(s)
    half = res["table"]["d_model/2"]["changes"]
    assert half["d_model"] == model["d_model"] // 2
    # the Noam peak, factor * d_model^-0.5, is the base's
    assert half["lr_factor"] * half["d_model"] ** -0.5 == pytest.approx(s["lr_factor"] * model["d_model"] ** -0.5)
    for c in res["comparisons"].values():
        assert set(c["metrics"]) == {"test_bleu", "test_ppl"} and c["status"] == "complete"
    stamps = [f.stat().st_mtime_ns for f in sorted((tmp_path / "finished").glob("*.json"))]
    run_script("multi30k_table3", tmp_path)
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "finished").glob("*.json"))] == stamps


def test_multi30k_run_cut_short_resumes_to_the_same_model(tmp_path, monkeypatch):
    # a run interrupted after its step-4 checkpoint, started again, must end where an uninterrupted run ends
    import multi30k_table3

    s = dict(multi30k_table3.QUICK, rows=["base"], seeds=[0])
    (_, job), = multi30k_table3.jobs_of(s, tmp_path / "whole", None)
    whole = multi30k_table3.run_one(job)
    (_, cut), = multi30k_table3.jobs_of(s, tmp_path / "cut", None)
    short = dict(cut, settings=dict(cut["settings"], steps=4))
    monkeypatch.setattr(multi30k_table3.shutil, "rmtree", lambda *a, **k: None)     # keep the checkpoints
    multi30k_table3.run_one(short)
    monkeypatch.undo()
    resumed = multi30k_table3.run_one(cut)
    assert resumed["resumed_at"] == 4 and whole["resumed_at"] == 0
    for name in ("test_bleu", "test_ppl", "valid_ppl"):
        assert resumed[name] == pytest.approx(whole[name], rel=1e-9), name
