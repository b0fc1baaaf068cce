"""The Table 3 study (experiments/table3.py) and the measurements every study of experiments/training.py takes.

The measurements are checked on stand-in models whose answer is known by hand: a model that always gives the
same logits has a perplexity and a calibration that follow from those logits alone.
"""

import math
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
    s = training.settings_for("toy", d_k=5, positional="learned", label_smoothing=0.2, steps=7)
    assert s["model"]["d_k"] == 5 and s["model"]["positional"] == "learned"
    assert s["label_smoothing"] == 0.2 and s["steps"] == 7 and s["progress"] is False
    with pytest.raises(ValueError, match="unknown setting 'heads'"):
        training.settings_for("toy", heads=2)


@pytest.mark.parametrize("name", list(table3.ROWS))
def test_each_row_changes_what_it_names_and_nothing_else(name):
    settings = table3.row_settings("toy", name, steps=3, seed=0)
    base = table3.row_settings("toy", "base", steps=3, seed=0)
    changes = table3.ROWS[name][1]
    changed = {k for k in {*settings, *settings["model"]} - {"model"}
               if settings.get(k, settings["model"].get(k)) != base.get(k, base["model"].get(k))}
    if "num_encoder_layers" in changes:                              # N counts the layers of both stacks
        changes = {**changes, "num_decoder_layers": changes["num_encoder_layers"]}
    assert changed == {k for k, v in changes.items() if table3.BASE.get(k) != v or k == "num_decoder_layers"}
    for key, value in changes.items():
        assert settings["model"].get(key, settings.get(key)) == value
    if table3.ROWS[name][0] == "A":                                  # fixed computation: h * d_k as in the base
        assert changes["num_heads"] * changes["d_k"] == table3.BASE["num_heads"] * table3.BASE["d_k"]


def test_table3_quick(tmp_path):
    p = run_script("table3", tmp_path)
    s, res = p["settings"], p["results"]
    assert pngs(tmp_path) == ["table3_rows.png"]
    assert len(res["runs"]) == len(s["rows"]) * len(s["seeds"])
    for run in res["runs"]:
        assert run["ppl"] > 1 and 0 <= run["bleu"] <= 100 and run["train_seconds"] > 0
    table = res["table"]
    assert set(table) == set(s["rows"])
    # h = 1 at d_k = 64 has the base's parameters (fixed h * d_k); learned positions add a table per side
    assert table["h=1"]["params"] == table["base"]["params"]
    max_len = TRANSLATION_MAX_LEN                                   # the rows of a toy model's position table
    assert table["learned"]["params"] - table["base"]["params"] == 2 * max_len * table3.BASE["d_model"]
    for row in table.values():
        assert row["ppl"]["min"] <= row["ppl"]["mean"] <= row["ppl"]["max"]
        assert row["paper"]["bleu"] > 20
