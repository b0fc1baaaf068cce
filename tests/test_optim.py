"""Optimisers, schedule and clipping: parity with torch.optim / torch.nn.utils in float64, the schedule's
values by hand, exact resume from a state_dict (through an .npz file). (Their argument refusals are in
test_input_validation.py.)"""

import io
import math

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import optim

TORCH_TOL = 1e-12        # same update rule, same order of operations: only rounding differs
SHAPES = [(3, 5), (7,), (2, 3, 4)]


@pytest.fixture(autouse=True)
def float64():
    mt.set_default_dtype("float64")
    yield
    mt.set_default_dtype("float32")


def make_params(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [mt.Parameter(rng.normal(size=s)) for s in shapes]


def random_grads(rng, shapes=SHAPES, scale=1.0):
    return [rng.normal(scale=scale, size=s) for s in shapes]


def set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad[...] = g


def run_against_torch(torch, ours, theirs, params, tparams, steps, lrs=None, seed=1):
    """Apply the same random gradients to both optimisers for `steps` steps; return the worst difference."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for k in range(steps):
        grads = random_grads(rng, scale=10.0 ** rng.uniform(-3, 1))      # gradients of varied size
        set_grads(params, grads)
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g)
        if lrs is not None:                                                # a schedule changing lr every step
            ours.lr = lrs[k]
            for group in theirs.param_groups:
                group["lr"] = lrs[k]
        ours.step()
        theirs.step()
        for i, (p, tp) in enumerate(zip(params, tparams)):
            diff = np.abs(p.data - tp.detach().numpy()).max()
            assert diff <= TORCH_TOL, f"step {k + 1}, parameter {i}: max |ours - torch| = {diff:.2e}"
            worst = max(worst, diff)
    return worst


# ------------------------------------------------------------------------------------------ torch parity

@pytest.mark.torch
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("betas,eps", [((0.9, 0.98), 1e-9), ((0.9, 0.999), 1e-8), ((0.5, 0.7), 1e-3)])
@pytest.mark.parametrize("vary_lr", [False, True])
def test_adam_equals_torch(weight_decay, betas, eps, vary_lr):
    torch = pytest.importorskip("torch")
    params = make_params()
    tparams = [torch.tensor(p.data.copy(), requires_grad=True) for p in params]
    ours = optim.Adam(params, lr=1e-2, betas=betas, eps=eps, weight_decay=weight_decay)
    theirs = torch.optim.Adam(tparams, lr=1e-2, betas=betas, eps=eps, weight_decay=weight_decay)
    lrs = list(np.linspace(1e-3, 3e-2, 8)) if vary_lr else None
    run_against_torch(torch, ours, theirs, params, tparams, steps=8, lrs=lrs)


@pytest.mark.torch
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_sgd_equals_torch(momentum, weight_decay):
    torch = pytest.importorskip("torch")
    params = make_params()
    tparams = [torch.tensor(p.data.copy(), requires_grad=True) for p in params]
    ours = optim.SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    theirs = torch.optim.SGD(tparams, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    run_against_torch(torch, ours, theirs, params, tparams, steps=6)


@pytest.mark.torch
@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_grad_norm_equals_torch(max_norm):
    torch = pytest.importorskip("torch")
    params = make_params()
    grads = random_grads(np.random.default_rng(2))
    set_grads(params, grads)
    tparams = [torch.tensor(p.data.copy(), requires_grad=True) for p in params]
    for tp, g in zip(tparams, grads):
        tp.grad = torch.tensor(g)
    norm = optim.clip_grad_norm(params, max_norm)
    ref = torch.nn.utils.clip_grad_norm_(tparams, max_norm)
    assert isinstance(norm, float)
    assert norm == pytest.approx(ref.item(), rel=TORCH_TOL)
    for i, (p, tp) in enumerate(zip(params, tparams)):
        diff = np.abs(p.grad - tp.grad.numpy()).max()
        assert diff <= TORCH_TOL, f"parameter {i}: max |grad - torch| = {diff:.2e}"


# ------------------------------------------------------------------------------------------ by hand

def test_clip_grad_norm_by_hand():
    params = make_params(shapes=[(2,), (1,)])
    set_grads(params, [np.array([3.0, 0.0]), np.array([4.0])])            # joint norm 5
    assert optim.clip_grad_norm(params, max_norm=10.0) == 5.0
    np.testing.assert_array_equal(params[0].grad, [3.0, 0.0])              # below max_norm: untouched
    assert optim.clip_grad_norm(params, max_norm=1.0) == 5.0               # returns the norm BEFORE clipping
    scale = 1.0 / (5.0 + 1e-6)
    np.testing.assert_allclose(params[0].grad, [3.0 * scale, 0.0], rtol=1e-15)
    np.testing.assert_allclose(params[1].grad, [4.0 * scale], rtol=1e-15)


def test_adam_first_step_by_hand():
    # after one step m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps)
    params = make_params(shapes=[(3,)])
    start = params[0].data.copy()
    g = np.array([2.0, -0.5, 1e-3])
    set_grads(params, [g])
    optim.Adam(params, lr=0.1, eps=1e-9).step()
    np.testing.assert_allclose(params[0].data, start - 0.1 * g / (np.abs(g) + 1e-9), rtol=1e-14)


def test_weight_decay_does_not_touch_grad_and_zero_grad_clears():
    params = make_params()
    grads = random_grads(np.random.default_rng(3))
    set_grads(params, grads)
    opt = optim.Adam(params, weight_decay=0.1)
    opt.step()
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad, g)
    opt.zero_grad()
    assert all(not p.grad.any() for p in params)


def test_noam_schedule_values():
    opt = optim.Adam(make_params())
    sched = optim.NoamSchedule(opt, d_model=512, warmup=4000)
    peak = 1.0 / math.sqrt(512 * 4000)                                     # the two terms meet at k = warmup
    assert sched.lr_at(4000) == pytest.approx(peak, rel=1e-15)
    assert sched.lr_at(4000) == pytest.approx(6.987712429686843e-04, rel=1e-14)
    assert sched.lr_at(1) == pytest.approx(512 ** -0.5 * 4000 ** -1.5, rel=1e-15)  # warmup branch: k * warmup^-1.5
    assert sched.lr_at(2000) == pytest.approx(peak / 2, rel=1e-14)        # linear warmup: half way, half the peak
    assert sched.lr_at(16000) == pytest.approx(peak / 2, rel=1e-14)       # decay as k^-0.5: 4x the steps, half
    assert sched.lr_at(4001) < peak and sched.lr_at(3999) < peak
    assert max(sched.lr_at(k) for k in range(1, 20000, 7)) <= peak
    assert optim.NoamSchedule(opt, 512, 4000, factor=2.0).lr_at(10) == pytest.approx(2 * sched.lr_at(10), rel=1e-15)


def test_noam_step_sets_optimizer_lr():
    opt = optim.SGD(make_params(), lr=1.0)
    sched = optim.NoamSchedule(opt, d_model=16, warmup=3, factor=1.0)
    assert sched.step_num == 0 and opt.lr == 1.0                            # nothing happens before the first step
    expected = [16 ** -0.5 * 1 * 3 ** -1.5, 16 ** -0.5 * 2 * 3 ** -1.5, 16 ** -0.5 * 3 ** -0.5, 16 ** -0.5 * 4 ** -0.5]
    for k, lr in enumerate(expected, start=1):
        assert sched.step() == pytest.approx(lr, rel=1e-15)
        assert opt.lr == pytest.approx(lr, rel=1e-15) and sched.step_num == k


# ------------------------------------------------------------------------------------------ resume

def npz_round_trip(state):
    """Through numpy.savez / numpy.load without pickle, as a checkpoint does."""
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.01),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: optim.SGD(ps, lr=0.1),
], ids=["adam", "sgd-momentum", "sgd"])
def test_state_dict_round_trip_continues_identically(make_opt):
    rng = np.random.default_rng(4)
    grads = [random_grads(rng) for _ in range(6)]
    params = make_params()
    opt = make_opt(params)
    sched = optim.NoamSchedule(opt, d_model=8, warmup=2)
    for g in grads[:3]:
        set_grads(params, g)
        sched.step()
        opt.step()

    opt_state, sched_state = npz_round_trip(opt.state_dict()), npz_round_trip(sched.state_dict())
    weights = [p.data.copy() for p in params]
    resumed = [mt.Parameter(w) for w in weights]
    opt2 = make_opt(resumed)
    sched2 = optim.NoamSchedule(opt2, d_model=8, warmup=2)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(sched_state)
    assert opt2.step_count == opt.step_count == 3 and sched2.step_num == 3 and opt2.lr == opt.lr

    for g in grads[3:]:
        for ps, o, s in ((params, opt, sched), (resumed, opt2, sched2)):
            set_grads(ps, g)
            s.step()
            o.step()
    for p, q in zip(params, resumed):
        np.testing.assert_array_equal(p.data, q.data)


def test_state_dict_is_plain_host_data_and_a_copy():
    params = make_params()
    opt = optim.Adam(params)
    set_grads(params, random_grads(np.random.default_rng(5)))
    opt.step()
    state = opt.state_dict()
    assert set(state) == {"step", "lr"} | {f"{n}.{i}" for n in "mv" for i in range(len(SHAPES))}
    assert state["step"] == 1 and isinstance(state["step"], int) and isinstance(state["lr"], float)
    assert all(isinstance(state[f"m.{i}"], np.ndarray) and state[f"m.{i}"].shape == s for i, s in enumerate(SHAPES))
    saved = state["m.0"].copy()
    opt.step()
    np.testing.assert_array_equal(state["m.0"], saved)


def test_load_state_dict_rejects_a_mismatch():
    state = optim.Adam(make_params()).state_dict()
    other = optim.Adam(make_params(shapes=[(3, 5), (8,), (2, 3, 4)]))
    with pytest.raises(ValueError, match=r"m\.1 must have shape \(8,\).*got \(7,\)"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        optim.Adam(make_params()).load_state_dict({k: v for k, v in state.items() if k != "v.2"})
    with pytest.raises(ValueError, match=r"unexpected \['m\.0'"):
        optim.SGD(make_params(), lr=0.1).load_state_dict(state)


# ------------------------------------------------------------------------------------------ CuPy

@pytest.mark.parametrize("tier", ["core", "fast"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("device", ["fakecupy", "cupy"])
def test_adam_on_a_device_equals_numpy(device, weight_decay, tier, request):
    """Adam on a device backend gives NumPy's numbers: exactly on the fake (NumPy underneath), to rounding on
    CuPy; parameters of two dtypes; weight decay leaves p.grad as it was; the state saved mid-run (host
    arrays) and loaded into a fresh optimiser on the device continues the same. The fast Adam keeps m and v
    of all parameters of a dtype in one flat array on a device (the state loads into views of it)."""
    import fakecupy
    from devices import TOLERANCE, use

    xp = request.getfixturevalue("cupy_gpu") if device == "cupy" else fakecupy
    Adam = optim.Adam if tier == "core" else mt.fast.Adam
    tol = TOLERANCE[device] if tier == "fast" else \
        {"rtol": 0, "atol": 0} if device == "fakecupy" else {"rtol": 1e-12, "atol": 1e-14}
    shapes = SHAPES + [(4, 1)]

    def build(on_device):
        params = make_params(seed=3, shapes=shapes)
        params[1] = mt.Parameter(params[1].data.astype(np.float32))      # a second dtype: its own flat arrays
        if on_device:
            mt.set_backend(xp)
            params = [mt.Parameter(xp.asarray(p.data)) for p in params]
        return params, Adam(params, lr=1e-2, weight_decay=weight_decay)

    rng = np.random.default_rng(7)
    draws = [random_grads(rng, shapes=shapes) for _ in range(3)]        # the gradients of three steps

    def run(params, opt, grad_sets):
        for grad_set in grad_sets:
            for p, g in zip(params, grad_set):
                p.grad[...] = mt.backend.asarray(g.astype(p.data.dtype))
            grads = [mt.to_numpy(p.grad).copy() for p in params]
            opt.step()
            for p, g in zip(params, grads):                                # p.grad untouched by the update
                np.testing.assert_array_equal(mt.to_numpy(p.grad), g)

    use("numpy")                                                           # the reference, whatever the session's
    ref_params, ref_opt = build(on_device=False)
    run(ref_params, ref_opt, draws)                                        # three steps on NumPy
    params, opt = build(on_device=True)
    run(params, opt, draws[:2])                                            # two on the device, then saved
    saved = opt.state_dict()
    params2, opt2 = build(on_device=True)
    for p2, p in zip(params2, params):
        p2.data[...] = p.data
    opt2.load_state_dict(saved)                                            # into the flat arrays' views
    run(params2, opt2, draws[2:])                                          # the third step, after loading
    for p, q in zip(ref_params, params2):
        assert q.data.dtype == p.data.dtype
        np.testing.assert_allclose(mt.to_numpy(q.data), p.data, **tol)
    for key, value in ref_opt.state_dict().items():
        np.testing.assert_allclose(opt2.state_dict()[key], value, **tol)


def test_cupy_adam_and_clip_match_numpy(cupy_gpu):
    cupy = cupy_gpu
    grads = random_grads(np.random.default_rng(6))
    params = make_params()
    set_grads(params, grads)
    norm = optim.clip_grad_norm(params, 1.0)
    optim.Adam(params, lr=1e-2).step()
    mt.set_backend("cupy")
    try:
        gparams = make_params()
        set_grads(gparams, [cupy.asarray(g) for g in grads])
        assert optim.clip_grad_norm(gparams, 1.0) == pytest.approx(norm, rel=1e-12)
        opt = optim.Adam(gparams, lr=1e-2)
        opt.step()
        for p, q in zip(params, gparams):
            np.testing.assert_allclose(cupy.asnumpy(q.data), p.data, atol=1e-12)
        assert isinstance(opt.state_dict()["m.0"], np.ndarray)
    finally:
        mt.set_backend("numpy")
