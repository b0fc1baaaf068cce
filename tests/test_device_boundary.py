"""The CuPy backend end to end, proven without a GPU.

tests/fakecupy.py behaves like CuPy at the device boundary: its arrays refuse implicit conversion to
NumPy (TypeError, as CuPy raises), NumPy functions called on them, and host arrays mixed into their
arithmetic; its random Generator has only CuPy's smaller API and its ufuncs have no ``.at``. On it, a
training step (forward, label-smoothed loss, backward, clipping, Adam with the Noam schedule), evaluation,
greedy and beam decoding, gradcheck and the Trainer all run, and give NumPy's numbers exactly (the fake
computes with NumPy underneath, so any difference would be a bug in how the package moves arrays).

Where CuPy and a GPU are present (benchmarks/gpu.sh), every test also runs on the real CuPy, against NumPy
in float64 with a tight tolerance (a GPU sums in another order; dropout is off where numbers are compared,
since the two backends draw different dropout masks for one seed).
"""

import inspect
import types

import fakecupy
import numpy as np
import pytest
from devices import TOLERANCE, use

import minitransformer as mt
from minitransformer.kit.running.trainer import Trainer
from minitransformer.kit.data.tasks import (
    SequenceTask,
    TaskBatches,
    exact_match,
    heldout_batches,
)

TASK = SequenceTask("copy", num_symbols=6, min_len=2, max_len=6)


def assert_close(actual, expected, device, what=""):
    np.testing.assert_allclose(actual, expected, err_msg=what, **TOLERANCE[device])


def batch():
    """A host batch with padding in source and target, as a data loader gives it."""
    rng = np.random.default_rng(1)
    src = rng.integers(3, 13, size=(3, 7))                    # (B,S)
    src[0, 5:] = 0
    src[2, 3:] = 0
    tgt = rng.integers(3, 11, size=(3, 6))                    # (B,T+1)
    tgt[1, 4:] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def build(dropout=0.0):
    mt.manual_seed(0)                                         # the host generator: same weights on every backend
    config = mt.TransformerConfig(src_vocab_size=13, tgt_vocab_size=11, d_model=16, num_heads=2,
                                  num_encoder_layers=2, num_decoder_layers=2, d_ff=24, dropout=dropout, max_len=24)
    return mt.Transformer(config)


def training_step(backend_name, steps=2):
    """``steps`` full training steps: everything they produce, as host arrays; the model; the optimiser; and
    (on the fake) the size of every device-to-host copy the steps themselves made."""
    use(backend_name)
    model = build()
    loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    # eps 1e-6 rather than 1e-9: a gradient that is zero in exact arithmetic (the key bias) is rounding noise
    # of ~1e-17, which Adam with a tiny eps would turn into a full step of either sign on CPU and GPU alike.
    opt = mt.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
    sched = mt.optim.NoamSchedule(opt, d_model=16, warmup=4, factor=1.0)
    src, tgt_in, tgt_out = batch()
    out, host_sizes = {"loss": [], "norm": []}, []
    for _ in range(steps):
        fakecupy.transfers.reset()
        logits = model(src, tgt_in)                           # (B,T,V)
        out["loss"].append(loss_fn(logits, tgt_out))
        model.backward(loss_fn.backward())
        out["norm"].append(mt.optim.clip_grad_norm(model.parameters(), max_norm=0.5))  # clips: the norm is > 1
        sched.step()
        opt.step()
        host_sizes += fakecupy.transfers.host_sizes
        # the test's own copies (after opt.step, which leaves the gradients as they were): copied, since on
        # NumPy to_numpy returns the array itself, which zero_grad and the next forward would overwrite
        out["logits"] = mt.to_numpy(logits).copy()
        out.update({f"grad {name}": mt.to_numpy(p.grad).copy() for name, p in model.named_parameters()})
        opt.zero_grad()
    out.update({f"weight {name}": w for name, w in model.state_dict().items()})
    out.update({f"adam {k}": v for k, v in opt.state_dict().items()})
    return out, model, opt, host_sizes


# ------------------------------------------------------------------------------------------- the fake

def test_the_fake_refuses_what_cupy_refuses():
    x = fakecupy.asarray(np.arange(6.0).reshape(2, 3))       # (2,3) on the "device"
    refused = {
        "numpy.asarray(x)": lambda: np.asarray(x),
        "x.__array__()": lambda: x.__array__(),
        "numpy.array([x])": lambda: np.array([x, x]),
        "numpy.exp(x)": lambda: np.exp(x),
        "numpy.sum(x)": lambda: np.sum(x),
        "numpy.concatenate": lambda: np.concatenate([x, x]),
        "x + host": lambda: x + np.ones(3),
        "host * x": lambda: np.ones(3) * x,
        "host mask in where": lambda: fakecupy.where(np.ones((2, 3), dtype=bool), x, 0.0),
        "x @ host": lambda: x @ np.ones((3, 2)),
        "assert_allclose(x, ...)": lambda: np.testing.assert_allclose(x, 0.0),
    }
    for what, call in refused.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"the fake let {what} through")
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[...] = np.zeros((2, 3))                             # CuPy's fill refuses host arrays too


def test_the_fake_allows_what_cupy_allows():
    x = fakecupy.asarray(np.arange(6.0).reshape(2, 3))
    total = x.sum()
    assert isinstance(total, fakecupy.ndarray) and total.ndim == 0   # reductions stay on the device, 0-d
    assert float(total) == 15.0 and int(x.max()) == 5 and bool(x.any())
    host = x.get()
    assert type(host) is np.ndarray and np.array_equal(host, np.arange(6.0).reshape(2, 3))
    assert isinstance(np.float32(2) * x, fakecupy.ndarray)   # NumPy scalars mix in, as on CuPy
    x[:, [0, 2]] = -1.0                                       # list indices are copied over, as on CuPy
    x[np.array([1])] = np.float64(7.0)
    assert x.get().tolist() == [[-1.0, 1.0, -1.0], [7.0, 7.0, 7.0]]
    assert f"{total:.1f}" == "15.0"                           # formatting reads the value, as CuPy's does


def test_the_fake_has_cupys_smaller_api():
    rng = fakecupy.random.default_rng(0)
    for missing in ("normal", "choice", "permutation", "shuffle"):
        assert not hasattr(rng, missing)
    draws = rng.random((2, 3), dtype=np.float32)
    assert isinstance(draws, fakecupy.ndarray) and draws.dtype == np.float32
    assert list(inspect.signature(fakecupy.add.at).parameters) == ["a", "indices", "b"]   # cupy.ufunc.at's


def test_the_fake_offers_nothing_cupy_lacks():
    """Everything the package can call on the fake exists in real CuPy, by the same name and with the same
    parameter names: else a step that passes on the fake would fail on a GPU with an AttributeError or an
    unexpected keyword. Needs CuPy importable, not a GPU (CuPy imports without a CUDA driver)."""
    cupy = pytest.importorskip("cupy")
    own = {"transfers", "Generator", "annotations"}             # the fake's bookkeeping; cupy.random.Generator below
    missing = [name for name, value in vars(fakecupy).items()
               if not name.startswith("_") and name not in own and not isinstance(value, types.ModuleType)
               and not hasattr(cupy, name)]
    missing += [f"{name}.at" for name, value in vars(fakecupy).items()
                if hasattr(value, "at") and not hasattr(getattr(cupy, name, None), "at")]
    missing += [f"ndarray.{name}" for name in dir(fakecupy.ndarray)
                if not name.startswith("_") and not hasattr(cupy.ndarray, name)]
    assert missing == [], f"the fake has names real CuPy {cupy.__version__} lacks: {missing}"

    fake, real = fakecupy.random.Generator, cupy.random.Generator
    for name in (n for n in vars(fake) if not n.startswith("_")):
        assert hasattr(real, name), f"cupy.random.Generator has no {name}"
        fake_params = list(inspect.signature(getattr(fake, name)).parameters)
        real_params = list(inspect.signature(getattr(real, name)).parameters)
        assert fake_params == real_params, f"Generator.{name}: fake {fake_params}, CuPy {real_params}"


def cupy_parameter_names(cupy, owner, name):
    """The parameter names of CuPy's function or method ``name`` (owner: "cupy", "cupy.ndarray" or
    "cupy.random.Generator"). ndarray's methods are compiled and have no signature to inspect: their
    docstring's first line is the signature, "_ndarray_base.sum(self, axis=None, dtype=None, ...)"."""
    obj = {"cupy": cupy, "cupy.ndarray": cupy.ndarray,
           "cupy.random.Generator": cupy.random.Generator}[owner]
    f = getattr(obj, name)
    if isinstance(f, cupy.ufunc):
        return {"out", "dtype", "casting"}
    try:
        return set(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        inside = f.__doc__.splitlines()[0].partition("(")[2].rpartition(")")[0]   # "self, axis=None, ..."
        return {part.split("=")[0].strip().lstrip("*").split()[-1] for part in inside.split(",")}


def test_the_package_calls_cupy_only_with_keywords_cupy_takes(monkeypatch, tmp_path):
    """The fake passes keywords through to NumPy, which takes more than CuPy does (``sum(where=)``,
    ``zeros(like=)``, ...): a keyword only NumPy knows would pass every fake test and fail on a GPU. So a
    Trainer run with checkpoints and resume, dropout, decoding and gradcheck run on the fake while every
    keyword the package passes to a fake function, array method or generator is recorded; CuPy must take each."""
    cupy = pytest.importorskip("cupy")
    keywords = set()                                          # (owner, name, keyword)

    def record(owner, label):
        for name, f in list(vars(owner).items()):
            if name.startswith("_") or isinstance(f, type) or not isinstance(f, types.FunctionType):
                continue

            def recording(*args, _f=f, _name=name, **kwargs):
                keywords.update((label, _name, k) for k in kwargs)
                return _f(*args, **kwargs)
            recording.__dict__.update(f.__dict__)             # add.at stays on add
            monkeypatch.setattr(owner, name, recording)

    record(fakecupy, "cupy")
    record(fakecupy.ndarray, "cupy.ndarray")
    record(fakecupy.Generator, "cupy.random.Generator")
    use("fakecupy")
    make_trainer(tmp_path, max_steps=6).fit()                 # steps, clipping, Adam, evaluation, greedy, saving
    trainer = make_trainer(tmp_path, max_steps=8)
    trainer.resume(tmp_path)                                  # checkpoints back onto the device
    trainer.fit()
    src, tgt_in, tgt_out = batch()
    model = build(dropout=0.3)                                # dropout's masks
    loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    mt.decoding.beam_search(trainer.model, src[:, :5] % TASK.vocab_size, beam_size=2, max_len=6)
    mt.set_default_dtype("float64")                           # gradcheck's finite differences (conftest restores)
    mt.gradcheck.check(mt.layers.Embedding(7, 4), np.array([[1, 1, 2, 6]]), max_entries=4).assert_ok(1e-6)

    assert len(keywords) > 5, "nothing recorded: the recording wrappers were not called"
    refused = sorted(k for k in keywords if k[2] not in cupy_parameter_names(cupy, *k[:2]))
    assert refused == [], f"keywords CuPy {cupy.__version__} does not take: {refused}"


def test_backend_scatter_add_adds_every_repeat_on_the_device():
    xp = use("fakecupy")
    target = xp.zeros((4, 2), dtype=xp.float32)               # (V,D)
    mt.backend.scatter_add(target, xp.asarray([1, 3, 1]), xp.ones((3, 2), dtype=xp.float32))
    assert target.get()[:, 0].tolist() == [0.0, 2.0, 0.0, 1.0]   # both repeats of id 1 added


# ------------------------------------------------------------------------------------- training step

def test_training_step_matches_numpy(device, float64):
    expected, _, _, _ = training_step("numpy")
    actual, model, opt, host_sizes = training_step(device)
    assert set(actual) == set(expected)
    for key in expected:
        assert_close(actual[key], expected[key], device, key)
    xp = mt.backend.xp()
    for name, p in model.named_parameters():                 # weights, gradients and Adam's moments stay on the device
        assert isinstance(p.data, xp.ndarray) and isinstance(p.grad, xp.ndarray), name
    assert all(isinstance(a, xp.ndarray) for arrays in opt.state.values() for a in arrays)
    if device == "fakecupy":
        # Only scalars come back to the host in a step, never an activation: per step the loss's check for bad
        # targets, its token count and its sum, and the gradient norm. The embeddings do not check the ids'
        # range on the device: the Transformer checked them on the host.
        assert set(host_sizes) == {1}, host_sizes
        assert len(host_sizes) <= 4 * 2, host_sizes           # two steps


@pytest.mark.parametrize("name", ["numpy", "fakecupy", "cupy"])
def test_a_float32_step_computes_in_float32(name, request):
    """Training runs in float32 (the default dtype): every array a layer's forward or backward returns, the
    logits and their gradient, and every weight, gradient and Adam moment after a step with dropout are
    float32. A scalar or mask promoted to float64 somewhere would double the step's memory traffic without an
    error; in-place adds into the float32 gradients would hide it, so each layer's outputs are checked. On a
    GPU this checks CuPy's own type promotion, which the fake (NumPy underneath) cannot."""
    if name == "cupy":
        request.getfixturevalue("cupy_gpu")
    use(name)
    mt.set_default_dtype("float32")
    model = build(dropout=0.1)
    seen = []                                                 # (module, "forward"/"backward", dtype)

    def recording(module, kind, method):
        def wrapper(*args, **kwargs):
            out = method(*args, **kwargs)
            for array in out if isinstance(out, tuple) else (out,):
                if hasattr(array, "dtype") and array.dtype.kind == "f":
                    seen.append((type(module).__name__, kind, array.dtype))
            return out
        return wrapper

    for _, module in model.named_modules():                  # instance attributes shadow the class's methods
        module.forward = recording(module, "forward", module.forward)
        module.backward = recording(module, "backward", module.backward)
    loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    opt = mt.optim.Adam(model.parameters())
    src, tgt_in, tgt_out = batch()
    logits = model(src, tgt_in)
    loss_fn(logits, tgt_out)
    dlogits = loss_fn.backward()
    model.backward(dlogits)
    opt.step()
    assert logits.dtype == dlogits.dtype == np.float32
    assert {kind for _, kind, _ in seen} == {"forward", "backward"} and len(seen) > 50
    assert [entry for entry in seen if entry[2] != np.float32] == []
    arrays = {f"{what} {n}": a for n, p in model.named_parameters() for what, a in (("weight", p.data), ("grad", p.grad))}
    arrays.update({f"adam {k} {i}": a for k, state in opt.state.items() for i, a in enumerate(state)})
    assert {k: a.dtype for k, a in arrays.items() if a.dtype != np.float32} == {}


def test_dropout_draws_on_the_device(device):
    use(device)
    src, tgt_in, tgt_out = batch()

    def loss_with_dropout():
        model = build(dropout=0.3)                            # manual_seed: the device generator restarts too
        loss_fn = mt.CrossEntropyLoss(ignore_index=0)
        loss = loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        return loss, mt.to_numpy(model.src_embed.weight.grad).copy()

    (loss1, grad1), (loss2, grad2) = loss_with_dropout(), loss_with_dropout()
    model = build(dropout=0.3).eval()
    loss_eval = mt.CrossEntropyLoss(ignore_index=0)(model(src, tgt_in), tgt_out)
    # Reproducible for one seed. On a GPU the embedding's scatter-add sums repeats with atomics, in any order:
    # float32 rounding, so the gradient is compared to rounding there (and exactly on the fake).
    rtol = 0 if device == "fakecupy" else 1e-5
    assert np.isfinite(loss1) and loss1 == pytest.approx(loss2, rel=rtol, abs=0)
    np.testing.assert_allclose(grad1, grad2, rtol=rtol, atol=1e-7 if rtol else 0)
    assert loss1 != pytest.approx(loss_eval, rel=1e-3)        # and the masks did drop something


# -------------------------------------------------------------------------------- evaluation, decoding

def test_evaluation_matches_numpy(device, float64):
    src, tgt_in, tgt_out = batch()
    results = {}
    for name in ("numpy", device):
        use(name)
        model = build(dropout=0.1).eval()                     # eval: dropout is the identity on both backends
        loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
        logits = model(src, tgt_in)
        logits_again = model(src, tgt_in)                     # eval mode: forwards without backward
        results[name] = (loss_fn(logits, tgt_out), mt.to_numpy(logits), mt.to_numpy(logits_again),
                         loss_fn.num_tokens, model.attention_maps()["decoder_cross"][0])
    for a, b in zip(results[device], results["numpy"]):
        assert_close(a, b, device)


@pytest.fixture(scope="module")
def trained():
    """A copy-task model trained for 60 steps on NumPy (float64), so that decoding gives varied lengths
    and tokens rather than one token repeated; its config and weights."""
    backend, dtype = mt.get_backend(), mt.get_default_dtype()
    mt.set_backend("numpy")
    mt.set_default_dtype("float64")
    try:
        mt.manual_seed(0)
        config = mt.TransformerConfig(TASK.vocab_size, TASK.vocab_size, d_model=16, num_heads=2,
                                      num_encoder_layers=1, num_decoder_layers=1, d_ff=24, dropout=0.0, max_len=16)
        model = mt.Transformer(config)
        opt = mt.optim.Adam(model.parameters(), lr=1.0)
        sched = mt.optim.NoamSchedule(opt, config.d_model, warmup=10, factor=0.2)
        Trainer(model, mt.CrossEntropyLoss(0, 0.1), opt, TaskBatches(TASK, 8, 7, seed=3), scheduler=sched,
                         clip_norm=1.0, max_steps=60, progress=False).fit()
        return config, model.state_dict()
    finally:
        mt.set_backend(backend)
        mt.set_default_dtype(dtype)


def test_decoding_matches_numpy(device, float64, trained):
    config, weights = trained
    pairs = TASK.sample(np.random.default_rng(9), 6)
    src = np.zeros((len(pairs), TASK.max_len), dtype=np.int64)   # (B,S), padded
    for i, (s, _) in enumerate(pairs):
        src[i, :len(s)] = s
    outputs = {}
    for name in ("numpy", device):
        use(name)
        model = mt.Transformer(config)
        model.load_state_dict(weights)                        # host weights copied onto the device
        outputs[name] = (mt.decoding.greedy_decode(model, src, max_len=8),
                         mt.decoding.greedy_decode(model, src, max_len=8, naive=True),
                         mt.decoding.beam_search(model, src, beam_size=3, max_len=8),
                         mt.decoding.beam_search(model, src, beam_size=2, alpha=0.0))
    assert outputs[device] == outputs["numpy"]
    greedy, _, beam, _ = outputs["numpy"]
    assert len({len(h) for h in greedy + beam}) > 2 and len({t for h in greedy for t in h}) > 2  # a real test


# ------------------------------------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("case", ["attention", "embedding", "dropout_sublayer"])
def test_gradcheck_runs_on_the_device(device, float64, case):
    use(device)
    rng = np.random.default_rng(0)
    mt.manual_seed(1)
    if case == "attention":                                   # host inputs and a host mask: gradcheck moves them
        x = rng.standard_normal((2, 5, 6))                    # (B,T,D)
        ids = rng.integers(3, 9, size=(2, 5))
        ids[1, 3:] = 0
        mask = mt.masks.padding_mask(ids, 0) & mt.masks.subsequent_mask(5)   # (B,1,T,T) on the device
        module, inputs = mt.layers.MultiHeadAttention(6, 3, dropout=0.2), (x, x.copy(), x.copy(), mask)
    elif case == "embedding":                                 # repeated ids: the scatter-add path
        module, inputs = mt.layers.Embedding(7, 4, scale=True), (np.array([[1, 1, 2, 6], [3, 1, 0, 0]]),)
    else:                                                     # dropout masks drawn by the device generator

        class Block(mt.Module):
            def __init__(self):
                super().__init__()
                self.sublayer = mt.layers.SublayerConnection(6, dropout=0.3)
                self.ffn = mt.layers.PositionwiseFeedForward(6, 9)

            def forward(self, x):
                return self.sublayer.forward(x, self.ffn.forward)

            def backward(self, dout):
                return self.sublayer.backward(dout, self.ffn.backward)

        module, inputs = Block(), (rng.standard_normal((2, 3, 6)),)
    report = mt.gradcheck.check(module, *inputs, max_entries=12)
    report.assert_ok(1e-6)
    assert all(isinstance(p.grad, mt.backend.xp().ndarray) for p in module.parameters())


# --------------------------------------------------------------------------------------------- Trainer

def make_trainer(checkpoint_dir=None, max_steps=12):
    mt.manual_seed(0)
    config = mt.TransformerConfig(TASK.vocab_size, TASK.vocab_size, d_model=16, num_heads=2, num_encoder_layers=1,
                                  num_decoder_layers=1, d_ff=24, dropout=0.0, max_len=16)
    model = mt.Transformer(config)
    opt = mt.optim.Adam(model.parameters(), lr=1.0, eps=1e-6)
    sched = mt.optim.NoamSchedule(opt, config.d_model, warmup=10, factor=0.2)
    heldout = TASK.heldout(20)
    return Trainer(
        model, mt.CrossEntropyLoss(0, 0.1), opt, TaskBatches(TASK, batch_size=8, batches_per_epoch=5, seed=3),
        scheduler=sched, valid_data=heldout_batches(heldout), clip_norm=1.0, max_steps=max_steps, eval_every=6,
        metric_fn=lambda m: exact_match(m, heldout, max_len=8), checkpoint_dir=checkpoint_dir,
        save_every=None if checkpoint_dir is None else 6,
        progress=False, config=config.to_dict())


def test_trainer_runs_and_resumes_on_the_device(device, float64, tmp_path):
    use("numpy")
    reference = make_trainer()
    reference.fit()
    use(device)
    full = make_trainer(tmp_path / "full")
    summary = full.fit()
    assert summary["steps"] == 12 and np.isfinite(summary["valid_loss"]) and 0 <= summary["metric"] <= 1
    assert_close([h[1] for h in full.history], [h[1] for h in reference.history], device, "losses")
    assert_close([v[1:] for v in full.valid_history], [v[1:] for v in reference.valid_history], device, "eval")
    # stop at 6, resume in a fresh trainer (weights, Adam's moments and the schedule go back onto the device)
    make_trainer(tmp_path / "split", max_steps=6).fit()
    resumed = make_trainer(tmp_path / "split")
    resumed.resume(tmp_path / "split")
    resumed.fit()
    assert_close([h[1] for h in resumed.history], [h[1] for h in full.history], device, "resumed losses")
    for name, w in resumed.model.state_dict().items():
        assert_close(w, full.model.state_dict()[name], device, name)
