"""CrossEntropyLoss: finite differences in float64, parity with torch.nn.functional.cross_entropy, edge cases."""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.loss import CrossEntropyLoss

GRAD_REL_TOL = 1e-7      # CS231n's bound for a float64 gradient check (see numeric_grad)
TORCH_TOL = 1e-10        # same formula, different order of operations: only rounding differs


@pytest.fixture(autouse=True)
def float64():
    mt.set_default_dtype("float64")
    yield
    mt.set_default_dtype("float32")


def make_batch(shape, V, seed, pad_fraction=0.3, ignore_index=0):
    """Random logits (*shape, V) and targets (*shape) with about pad_fraction of them set to ignore_index."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(*shape, V))                              # (..., V)
    target = rng.integers(1, V, size=shape)                               # (...)
    target[rng.random(shape) < pad_fraction] = ignore_index
    return logits, target


def rel_error(a, b):
    return np.abs(a - b) / np.maximum(1e-8, np.abs(a) + np.abs(b))


def numeric_grad(f, x, h=3e-3):
    """Central differences of the scalar f at every element of x, the five-point stencil

        f'(x) ~ (f(x - 2h) - 8 f(x - h) + 8 f(x + h) - f(x + 2h)) / (12 h)     error O(h^4)

    With h = 3e-3 truncation (~h^4) and roundoff (~1e-16 / h) both stay below ~1e-13 absolute, so even
    the smallest gradient entries (p - eps/V can be ~1e-5) are checked to better than 1e-7 relative
    (measured: < 1e-8 over many seeds); the two-point stencil's ~1e-11 floor would not allow that.
    """
    grad = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        old = x[idx]
        values = []
        for step in (-2, -1, 1, 2):
            x[idx] = old + step * h
            values.append(f(x))
        x[idx] = old
        f_m2, f_m1, f_p1, f_p2 = values
        grad[idx] = (8 * (f_p1 - f_m1) - (f_p2 - f_m2)) / (12 * h)   # differences first: exact 0 stays 0
    return grad


# ------------------------------------------------------------------------------ gradient by finite differences

@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("shape,V", [((3, 5), 7), ((11,), 13)])
def test_gradient_matches_finite_differences(eps, shape, V):
    logits, target = make_batch(shape, V, seed=1)
    assert (target == 0).any() and (target != 0).any()
    loss_fn = CrossEntropyLoss(ignore_index=0, label_smoothing=eps)
    loss_fn(logits, target)
    analytic = loss_fn.backward()
    assert analytic.shape == logits.shape and analytic.dtype == np.float64
    numeric = numeric_grad(lambda x: CrossEntropyLoss(0, eps)(x, target), logits.copy())
    err = rel_error(analytic, numeric)
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() < GRAD_REL_TOL, (
        f"dlogits{worst}: analytic {analytic[worst]!r}, numeric {numeric[worst]!r}, rel error {err.max():.2e}")
    # ignored rows get exactly zero gradient
    assert np.all(analytic[target == 0] == 0)


# ------------------------------------------------------------------------------------------- torch parity

@pytest.mark.torch
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [0, -100, 4])
@pytest.mark.parametrize("shape,V", [((3, 5), 7), ((2, 9), 31), ((17,), 5)])
def test_value_and_gradient_equal_torch(eps, ignore_index, shape, V):
    torch = pytest.importorskip("torch")
    logits, target = make_batch(shape, V, seed=2, ignore_index=ignore_index)
    loss_fn = CrossEntropyLoss(ignore_index=ignore_index, label_smoothing=eps)
    loss = loss_fn(logits, target)
    dlogits = loss_fn.backward()

    x = torch.tensor(logits.reshape(-1, V), dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.cross_entropy(x, torch.tensor(target.reshape(-1)), ignore_index=ignore_index,
                                            label_smoothing=eps)
    ref.backward()
    assert isinstance(loss, float)
    assert abs(loss - ref.item()) <= TORCH_TOL * max(1.0, abs(ref.item())), (loss, ref.item())
    diff = np.abs(dlogits.reshape(-1, V) - x.grad.numpy()).max()
    assert diff <= TORCH_TOL, f"max |dlogits - torch| = {diff:.2e}"
    assert loss_fn.num_tokens == int((target != ignore_index).sum())


@pytest.mark.torch
def test_float32_logits_stay_float32_and_match_torch():
    torch = pytest.importorskip("torch")
    logits, target = make_batch((4, 6), 50, seed=3)
    logits = logits.astype(np.float32)
    loss_fn = CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    loss = loss_fn(logits, target)
    dlogits = loss_fn.backward()
    assert dlogits.dtype == np.float32
    x = torch.tensor(logits.reshape(-1, 50), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(x, torch.tensor(target.reshape(-1)), ignore_index=0, label_smoothing=0.1)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-5
    np.testing.assert_allclose(dlogits.reshape(-1, 50), x.grad.numpy(), atol=1e-7)


# --------------------------------------------------------------------------------------------- behaviour

def test_value_by_hand():
    # one row, V = 2, logits (0, log 3): p = (1/4, 3/4)
    logits = np.array([[0.0, np.log(3.0)]])
    assert CrossEntropyLoss(ignore_index=-1)(logits, np.array([1])) == pytest.approx(-np.log(0.75), abs=1e-15)
    # eps = 0.5: 0.5 * -log(3/4) + 0.5 * (-log(1/4) - log(3/4)) / 2
    expected = 0.5 * -np.log(0.75) + 0.25 * (-np.log(0.25) - np.log(0.75))
    assert CrossEntropyLoss(-1, 0.5)(logits, np.array([1])) == pytest.approx(expected, abs=1e-15)


def test_padding_leaves_sum_and_count():
    logits, target = make_batch((3, 5), 7, seed=4)
    kept = target != 0
    full = CrossEntropyLoss(ignore_index=0)(logits, target)
    only_kept = CrossEntropyLoss(ignore_index=0)(logits[kept], target[kept])
    assert full == pytest.approx(only_kept, abs=1e-14)


def test_large_logits_are_stable():
    logits, target = make_batch((2, 3), 6, seed=5)
    base = CrossEntropyLoss(0, 0.1)
    shifted = CrossEntropyLoss(0, 0.1)
    a = base(logits, target)
    b = shifted(logits + 1e4, target)
    assert np.isfinite(b) and b == pytest.approx(a, abs=1e-9)
    np.testing.assert_allclose(shifted.backward(), base.backward(), atol=1e-12)


def test_all_ignored_gives_zero_loss_and_zero_gradient():
    logits = np.random.default_rng(6).normal(size=(2, 3, 5))
    loss_fn = CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    assert loss_fn(logits, np.zeros((2, 3), dtype=np.int64)) == 0.0
    assert loss_fn.num_tokens == 0
    dlogits = loss_fn.backward()
    assert dlogits.shape == (2, 3, 5) and not dlogits.any()


def test_logits_are_not_modified_and_backward_needs_a_forward():
    logits, target = make_batch((3, 4), 9, seed=7)
    copy = logits.copy()
    loss_fn = CrossEntropyLoss()
    with pytest.raises(RuntimeError, match="forward"):
        loss_fn.backward()
    loss_fn(logits, target)
    loss_fn.backward()
    np.testing.assert_array_equal(logits, copy)
    with pytest.raises(RuntimeError, match="forward"):
        loss_fn.backward()


# -------------------------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("target,match", [
    (np.ones((3, 4)), "target must hold integer"),                        # float dtype
    (np.ones((3, 5), dtype=np.int64), r"target must have shape \(3, 4\)"),  # shape mismatch
    (np.ones((12,), dtype=np.int64), r"target must have shape \(3, 4\)"),   # flattened
    (np.full((3, 4), 9), r"target must hold class ids in \[0, 9\).*9"),     # == V
    (np.full((3, 4), -1), r"target must hold class ids in \[0, 9\).*-1"),   # negative, not ignore_index
])
def test_bad_target_raises_naming_it(target, match):
    logits = np.zeros((3, 4, 9))
    with pytest.raises(ValueError, match=match):
        CrossEntropyLoss(ignore_index=0)(logits, target)


def test_bad_logits_raise():
    with pytest.raises(TypeError, match="CrossEntropyLoss: logits must be a float array, got dtype int64"):
        CrossEntropyLoss()(np.zeros((2, 3), dtype=np.int64), np.zeros(2, dtype=np.int64))
    with pytest.raises(TypeError, match="CrossEntropyLoss: logits must be a float array, got list"):
        CrossEntropyLoss()([[0.0, 1.0]], np.zeros(1, dtype=np.int64))


# ------------------------------------------------------------------------------------------------- CuPy

def test_cupy_matches_numpy(cupy_gpu):
    cupy = cupy_gpu
    logits, target = make_batch((3, 5), 7, seed=8)
    ref = CrossEntropyLoss(0, 0.1)
    expected, expected_grad = ref(logits, target), ref.backward()
    mt.set_backend("cupy")
    try:
        loss_fn = CrossEntropyLoss(0, 0.1)
        loss = loss_fn(cupy.asarray(logits), cupy.asarray(target))
        grad = loss_fn.backward()
        assert isinstance(grad, cupy.ndarray)
        assert loss == pytest.approx(expected, abs=1e-12)
        np.testing.assert_allclose(cupy.asnumpy(grad), expected_grad, atol=1e-12)
    finally:
        mt.set_backend("numpy")
