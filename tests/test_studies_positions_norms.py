"""The positional extrapolation and the warmup / LayerNorm studies (experiments/extrapolation.py,
experiments/warmup_and_norm.py): each runs from its command with --quick and writes sane figures, and each
measurement it adds to the package is right on a case whose answer is known without it."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.kit.data.tasks import FIRST_SYMBOL, heldout_batches
from minitransformer.kit.data.vocab import EOS
from minitransformer.optim import NoamSchedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import extrapolation  # experiments/ is not a package: its scripts import each other by name
import warmup_and_norm
from test_experiments import run_script

# ---------------------------------------------------------------------------------------------- extrapolation


def test_extrapolation_quick_run(tmp_path):
    payload = run_script("extrapolation", tmp_path)
    s, res = payload["settings"], payload["results"]
    L = s["L"]
    assert len(res["runs"]) == len(s["tasks"]) * len(s["kinds"]) * len(s["seeds"])
    for r in res["runs"]:
        assert r["lengths"] == list(range(1, 2 * L + 1))
        assert len(r["exact_match"]) == len(r["output_length"]) == 2 * L
        assert all(0.0 <= e <= 1.0 for e in r["exact_match"])
        assert len(r["position_accuracy_2L"]) == 2 * L + 1           # 2L symbols, then the <eos>
        assert np.mean(r["exact_match"][:L]) > 0.5, f"{r['kind']} did not learn the lengths it was trained on"
        # greedy output is never longer than the decoding limit, source length + 2
        assert all(0 <= n <= length + 2 for n, length in zip(r["output_length"], r["lengths"]))
        if r["kind"] == "learned":
            for side in ("src", "tgt"):
                rows = r["learned_rows"][side]
                assert rows["rows"] == 2 * L + 2
                assert rows["max_change_unused"] == 0.0, "a row no batch used was changed by training"
                assert rows["max_change_used"] > 0.0
    for key, summary in res["summary"].items():
        assert len(summary["exact_match_mean"]) == 2 * L, key
    assert {p.name for p in tmp_path.glob("*.png")} == {"extrapolation_exact_match.png",
                                                         "extrapolation_diagnostics.png"}


def test_extrapolation_verdicts_on_constructed_runs():
    # L = 2: lengths 1, 2 seen, 3, 4 unseen. Sinusoidal ahead beyond L on every seed by a varying margin: the
    # extrapolation claims are reproduced; on the seen lengths both are at exact match 1: at the ceiling.
    s = {"tasks": ["copy"], "kinds": ["sinusoidal", "learned"], "L": 2}
    runs = []
    for seed, gain in enumerate([0.10, 0.20, 0.15]):
        runs.append({"task": "copy", "kind": "learned", "seed": seed, "exact_match": [1.0, 1.0, 0.0, 0.0]})
        runs.append({"task": "copy", "kind": "sinusoidal", "seed": seed, "exact_match": [1.0, 1.0, gain, 0.0]})
    c = extrapolation.comparisons(runs, s)
    assert c["copy: sinusoidal - learned, lengths 1..2"]["verdict"] == "at ceiling"
    assert c["copy: sinusoidal - learned, length 3"]["verdict"] == "reproduced"
    assert c["copy: sinusoidal - learned, length 3"]["metrics"]["exact_match"]["diffs"] == pytest.approx([0.1, 0.2, 0.15])
    assert c["copy: sinusoidal - learned, lengths 3..4"]["metrics"]["exact_match"]["mean"] == pytest.approx(0.075)
    # one seed the other way: the interval crosses zero
    runs[-1]["exact_match"] = [0.9, 1.0, 0.0, 0.0]
    runs[-2]["exact_match"] = [1.0, 1.0, 0.3, 0.0]
    c = extrapolation.comparisons(runs, s)
    assert c["copy: sinusoidal - learned, length 3"]["verdict"] == "inconclusive"
    assert c["copy: sinusoidal - learned, lengths 1..2"]["verdict"] == "inconclusive"   # -0.05 on one seed
    for r in runs:                                 # off the ceiling and equal: inside the margin, reproduced
        r["exact_match"][:2] = [0.8, 0.8]
    assert extrapolation.comparisons(runs, s)["copy: sinusoidal - learned, lengths 1..2"]["verdict"] == "reproduced"


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_test_pairs_have_the_asked_length_and_target(task):
    pairs = extrapolation.test_pairs(task, 7, 30)
    assert len(pairs) == 30
    for src, tgt in pairs:
        assert len(src) == 7
        assert tgt == (src if task == "copy" else src[::-1])
    assert pairs == extrapolation.test_pairs(task, 7, 30)               # the same strings for every run


class _CopyOracle:
    """Logits that put the maximum on the right next token of a copy, except at position ``wrong``."""

    def __init__(self, vocab, wrong):
        self.vocab, self.wrong = vocab, wrong

    def eval(self):
        pass

    def __call__(self, src, tgt_in):
        src = np.asarray(src)
        B, T = src.shape[0], src.shape[1] + 1
        answer = np.concatenate([src, np.full((B, 1), EOS)], axis=1)            # (B,T)
        answer[:, self.wrong] = FIRST_SYMBOL + (answer[:, self.wrong] - FIRST_SYMBOL + 1) % 10
        logits = np.zeros((B, T, self.vocab), dtype=np.float32)
        logits[np.arange(B)[:, None], np.arange(T)[None, :], answer] = 1.0
        return logits


def test_position_accuracy_finds_the_wrong_position():
    pairs = extrapolation.test_pairs("copy", 6, 20)
    acc = extrapolation.position_accuracy(_CopyOracle(FIRST_SYMBOL + 10, wrong=3), pairs)
    assert acc.shape == (7,)
    np.testing.assert_array_equal(acc, [1, 1, 1, 0, 1, 1, 1])


class _Table:
    def __init__(self, data):
        self.P = type("P", (), {"data": data})()


def test_learned_rows_measures_which_rows_moved():
    L, D = 3, 4
    initial = {"src": np.zeros((2 * L + 2, D)), "tgt": np.zeros((2 * L + 2, D))}
    src, tgt = initial["src"].copy(), initial["tgt"].copy()
    src[:L] = 0.5                                                                    # the rows training used
    tgt[:L + 1] = -0.25
    tgt[L + 2, 1] = 2.0                                                              # one an unused row
    model = type("M", (), {"src_pos": _Table(src), "tgt_pos": _Table(tgt)})()
    rows = extrapolation.learned_rows(model, initial, L)
    assert rows["src"]["max_change_used"] == 0.5 and rows["src"]["max_change_unused"] == 0.0
    assert rows["tgt"]["max_change_used"] == 0.25 and rows["tgt"]["max_change_unused"] == 2.0
    assert rows["src"]["norm_used"] == pytest.approx(0.5 * math.sqrt(D))


# ---------------------------------------------------------------------------------------------- warmup and norm


def test_warmup_and_norm_quick_run(tmp_path):
    payload = run_script("warmup_and_norm", tmp_path)
    s, res = payload["settings"], payload["results"]
    for norm in ("post-LN", "pre-LN"):
        for stack in ("encoder", "decoder"):
            g = res["grad_norms"][f"{norm}/{stack}"]
            assert len(g["mean"]) == s["layers"]
            assert all(0 < lo <= m <= hi and math.isfinite(hi) for lo, m, hi in zip(g["min"], g["mean"], g["max"]))
    assert len(res["grid"]) == 2 * len(s["peaks"]) * len(s["warmups"]) * len(s["seeds"])
    for r in res["grid"]:
        assert r["outcome"] in ("diverged", "stuck", "trained")
        assert 0.0 <= r["exact_match"] <= 1.0
        if r["loss_curve"]:
            # warmup 1 peaks at the cell's rate level; a longer warmup lower, at the same total rate
            if r["warmup"] == 1:
                assert r["max_lr"] == pytest.approx(r["peak"], rel=1e-9)
            else:
                assert r["max_lr"] < r["peak"]
            assert r["entropy"] > 0 and math.isfinite(r["final_loss"])
    assert {p.name for p in tmp_path.glob("*.png")} == {f"warmup_and_norm_{n}.png" for n in ("grad_norms", "grid",
                                                                                            "curves")}


@pytest.mark.parametrize(("peak", "d_model", "warmup"), [(1e-3, 64, 1), (3e-2, 64, 100), (5e-4, 512, 4000)])
def test_lr_factor_sets_the_peak(peak, d_model, warmup):
    schedule = NoamSchedule(SimpleNamespace(lr=0.0), d_model, warmup=warmup,
                            factor=warmup_and_norm.lr_factor_for(peak, d_model, warmup))
    rates = [schedule.step() for _ in range(2 * warmup + 5)]
    assert max(rates) == pytest.approx(peak, rel=1e-12)
    assert int(np.argmax(rates)) + 1 == warmup


@pytest.mark.parametrize("warmup", [30, 100])
def test_lr_factor_at_equal_total_matches_warmup_one_over_the_run(warmup):
    d_model, peak, steps = 64, 1e-3, 200

    def rates(w, factor):
        schedule = NoamSchedule(SimpleNamespace(lr=0.0), d_model, warmup=w, factor=factor)
        return [schedule.step() for _ in range(steps)]

    none = rates(1, warmup_and_norm.lr_factor_for(peak, d_model, 1, steps))
    warmed = rates(warmup, warmup_and_norm.lr_factor_for(peak, d_model, warmup, steps))
    assert max(none) == pytest.approx(peak, rel=1e-12)
    assert sum(warmed) == pytest.approx(sum(none), rel=1e-12)
    # at the same peak instead, the warmup would get several times the total rate: the confound removed
    same_peak = rates(warmup, warmup_and_norm.lr_factor_for(peak, d_model, warmup))
    assert sum(same_peak) > 4 * sum(none) and max(warmed) < peak / 4


def test_layer_grad_norms_groups_by_layer():
    config = mt.TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=8, num_heads=2, d_ff=12,
                                  num_encoder_layers=2, num_decoder_layers=3, dropout=0.0, max_len=16)
    model = mt.Transformer(config)
    count = {}
    for name, p in model.named_parameters():
        p.grad[...] = 0.0
        if name.startswith("decoder.layers.1."):
            p.grad[...] = 2.0                                                       # |g| = 2 sqrt(n)
            count["d1"] = count.get("d1", 0) + p.grad.size
        if name.startswith("encoder.layers.0."):
            p.grad[...] = 1.0
            count["e0"] = count.get("e0", 0) + p.grad.size
        if not name.startswith(("encoder.layers.", "decoder.layers.")):
            p.grad[...] = 100.0                                                     # embeddings, final norms: left out
    norms = warmup_and_norm.layer_grad_norms(model)
    assert norms["encoder"] == pytest.approx([math.sqrt(count["e0"]), 0.0])
    assert norms["decoder"] == pytest.approx([0.0, 2 * math.sqrt(count["d1"]), 0.0])


def test_target_entropy_of_known_frequencies():
    # targets 4, 5 and two <eos>: frequencies 1/4, 1/4, 1/2 -> H = 1.5 log 2
    batches = heldout_batches([([4], [4]), ([5], [5])])
    assert warmup_and_norm.target_entropy(batches) == pytest.approx(1.5 * math.log(2))


def test_outcome_classes():
    entropy = 2.4
    assert warmup_and_norm.outcome([2.8, float("nan"), 1.0], entropy) == "diverged"
    assert warmup_and_norm.outcome([2.8] * 5 + [3.0] * 50, entropy) == "diverged"         # not below its start
    assert warmup_and_norm.outcome([2.8] * 5 + [2.38] * 50, entropy) == "stuck"          # the input-free loss
    assert warmup_and_norm.outcome([2.8] * 5 + [0.5] * 50, entropy) == "trained"
    assert warmup_and_norm.outcome([], entropy) == "diverged"
