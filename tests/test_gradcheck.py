"""The gradient check itself, as a grade must rest on it: no false FAIL for a correct layer whatever seed a user
picks, no false PASS for a backward that edits its incoming gradient in place, and a zero-gradient row that says
what it is."""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L
from minitransformer.gradcheck import UPSTREAM_STREAM
from minitransformer.gradcheck import SelfAttention
from minitransformer.kit.cli.utility import gradcheck_cases


@pytest.mark.parametrize("seed, shape", [(0, (2, 3, 5)), (7, (2, 3, 5)), (0, (4, 6, 8)), (7, (4, 6, 8))])
def test_layernorm_passes_when_its_input_shares_the_checks_seed(float64, seed, shape):
    # The upstream gradient was once drawn from default_rng(seed) too: it equalled x, and LayerNorm's input
    # gradient for a g parallel to x is nearly zero, so rounding noise read as a relative error of ~1e-6.
    x = np.random.default_rng(seed).standard_normal(shape)
    report = mt.gradcheck.check(L.LayerNorm(shape[-1]), x, seed=seed)
    assert report.ok, report.table()
    assert report.max_error < 1e-8


def test_a_nearly_zero_gradient_is_judged_by_its_absolute_error(float64):
    # x drawn from the check's own upstream stream: g = x, the case above made on purpose. The input gradient
    # is ~1e-6 everywhere, where the difference quotient resolves ~1e-10: compared with the rounding floor, it
    # passes, and a gradient twice too large still fails.
    x = np.random.default_rng([UPSTREAM_STREAM, 0]).standard_normal((4, 6, 8))
    report = mt.gradcheck.check(L.LayerNorm(8), x)
    row = report.rows[0]
    assert abs(row.numeric) < 1e-5 and report.ok, report.table()

    class Doubled(L.LayerNorm):
        def backward(self, dout):
            return 2 * super().backward(dout)

    assert not mt.gradcheck.check(Doubled(8), x).rows[0].passes(1e-6)


def _random_layers(D, rng):
    yield L.Linear(D, 3)
    yield L.LayerNorm(D)
    yield L.Softmax(axis=int(rng.integers(-2, 0)))
    yield L.ReLU()
    yield L.Dropout(0.3)
    yield L.PositionwiseFeedForward(D, 5, dropout=0.2)
    yield L.PositionalEncoding(D, max_len=8)
    yield L.LearnedPositionalEmbedding(8, D)


def test_every_layer_passes_on_100_random_seeds_and_shapes(float64):
    """The input and the check share the seed, as a user would write it; sizes drawn at random."""
    pick = np.random.default_rng(2024)
    for _ in range(100):
        seed = int(pick.integers(0, 1000))
        shape = (int(pick.integers(1, 4)), int(pick.integers(1, 7)), int(pick.choice([2, 4, 6, 8])))
        x = np.random.default_rng(seed).standard_normal(shape)
        mt.manual_seed(seed)
        for layer in _random_layers(shape[-1], pick):
            report = mt.gradcheck.check(layer, x, seed=seed, max_entries=8)
            assert report.ok, f"seed {seed}, shape {shape}\n{report.table()}"
        attention = SelfAttention(L.MultiHeadAttention(shape[-1], 2))
        mask = mt.masks.subsequent_mask(shape[1])
        report = mt.gradcheck.check(attention, x, mask, seed=seed, max_entries=4)
        assert report.ok, f"seed {seed}, shape {shape}\n{report.table()}"


def test_every_case_of_the_gradcheck_command_passes_on_other_seeds(float64):
    if mt.get_backend() != "numpy":
        pytest.skip("the comparison layers (Conv1d's padding) need NumPy or CuPy itself")
    for seed in (1, 2):
        mt.manual_seed(seed)
        for label, module, inputs in gradcheck_cases(np.random.default_rng(seed)):
            report = mt.gradcheck.check(module, *inputs, seed=seed, max_entries=4)
            assert report.ok, f"{label}, seed {seed}\n{report.table()}"


class _Twice(mt.Module):
    """out = 2 x, with a backward that doubles dout in place: correct, since dout is its own to change."""

    def forward(self, x):
        out = 2 * x
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        dout *= 2
        return dout


class _TripledLinear(L.Linear):
    """A wrong backward: it triples dout in place, so every gradient comes out three times too large."""

    def backward(self, dout):
        dout *= 3
        return super().backward(dout)


def test_a_backward_that_edits_dout_in_place(float64):
    x = np.random.default_rng(1).standard_normal((2, 3, 5))
    assert mt.gradcheck.check(_Twice(), x).ok                  # was a false FAIL: g itself had been doubled
    report = mt.gradcheck.check(_TripledLinear(5, 4), x)       # was a false PASS at 1e-10
    assert not report.ok
    assert {r.name for r in report.failures()} == {"input[0]", "W", "b"}
    assert all(abs(r.analytic / r.numeric - 3) < 1e-6 for r in report.rows)


def test_a_forward_that_edits_its_input_cannot_corrupt_the_check(float64):
    class Scaled(mt.Module):
        def forward(self, x):
            out = 2 * x
            x *= 0                                            # the caller's array, were it not a copy
            self.save_for_backward(out)
            return out

        def backward(self, dout):
            self.saved(dout)
            return 2 * dout

    x = np.random.default_rng(1).standard_normal((2, 3, 5))
    kept = x.copy()
    assert mt.gradcheck.check(Scaled(), x).ok
    np.testing.assert_array_equal(x, kept)


def test_a_zero_gradient_row_reads_as_what_it_is(float64):
    mt.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((2, 4, 6))
    report = mt.gradcheck.check(L.MultiHeadAttention(6, 2), x, x.copy(), x.copy())
    (row,) = [r for r in report.rows if r.name == "W_k.b"]    # softmax ignores a shift shared by a row's scores
    assert row.zero and row.rel_error < 1e-6
    assert row.verdict(report.tolerance) == "ok: zero, both ways"
    table = report.table()
    assert "zero, both ways: analytic and numeric gradients are both below 1e-8" in table
    assert all(r.rel_error < 1e-6 for r in report.rows)       # no large number beside an "ok"
