"""Module and Parameter bookkeeping, and the backend switch."""

import inspect
import sys
import types

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L


class Tied(mt.Module):
    """One Parameter used by two layers: parameters() must list it once."""

    def __init__(self):
        super().__init__()
        self.a = L.Linear(3, 3)
        self.b = L.Linear(3, 3)
        self.b.W = self.a.W

    def forward(self, x):
        return self.b(self.a(x))

    def backward(self, dout):
        return self.a.backward(self.b.backward(dout))


def test_parameters_are_registered_recursively_and_once():
    m = Tied()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["a.W", "a.b", "b.b"]
    assert len(m.parameters()) == 3


def test_tied_gradient_is_the_sum_of_both_uses(float64, rng):
    m = Tied()
    x, dout = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    m(x)
    m.backward(dout)
    W = m.a.W.data
    h = x @ W + m.a.b.data
    expected = h.T @ dout + x.T @ (dout @ W.T)            # dW from use b plus dW from use a
    np.testing.assert_allclose(m.a.W.grad, expected, rtol=1e-12)
    mt.gradcheck.check(m, x).assert_ok(1e-6)


def test_gradients_accumulate_until_zero_grad(float64, rng):
    lin = L.Linear(4, 2)
    x, dout = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    lin(x)
    lin.backward(dout)
    once = lin.W.grad.copy()
    lin(x)
    lin.backward(dout)
    np.testing.assert_allclose(lin.W.grad, 2 * once, rtol=1e-12)
    lin.zero_grad()
    assert not lin.W.grad.any()


# The protocol lives in Module.save_for_backward / Module.saved, which every layer's forward and backward
# call; each protection is tested once here, and test_layers_are_their_own_code checks that each layer
# runs its own methods (nothing installed around them).

def test_second_forward_in_training_raises_and_eval_allows_many(rng):
    mha = L.MultiHeadAttention(4, 2)
    x = rng.standard_normal((1, 2, 4)).astype(np.float32)
    mha(x, x, x)
    # A composite module's error names the first child whose cache is still full (its query projection).
    with pytest.raises(RuntimeError, match="Linear: forward was called twice in training mode"):
        mha(x, x, x)
    mha.eval()                                                 # eval() forgets the saved forward
    out = mha(x, x, x)
    mha(x, x, x)                                               # inference: any number of forwards
    mha.backward(np.ones(out.shape, dtype=np.float32))         # the last one may still be gone back through


def test_backward_needs_its_own_forward_once(rng, float64):
    lin = L.Linear(4, 3)
    with pytest.raises(RuntimeError, match=r"Linear.backward: there is no forward to go back through"):
        lin.backward(np.ones((2, 3)))
    lin.forward(rng.standard_normal((2, 4)))                   # a direct forward counts as well as lin(x)
    lin.backward(np.ones((2, 3)))
    grads = {n: p.grad.copy() for n, p in lin.named_parameters()}
    with pytest.raises(RuntimeError, match="each forward allows one backward"):
        lin.backward(np.ones((2, 3)))
    for n, p in lin.named_parameters():                        # the refused backward added nothing
        np.testing.assert_array_equal(p.grad, grads[n], err_msg=n)
    lin(rng.standard_normal((2, 4)))
    lin.clear_caches()
    with pytest.raises(RuntimeError, match="there is no forward to go back through"):
        lin.backward(np.ones((2, 3)))


def test_dout_must_have_the_output_shape(rng, float64):
    """A dout of another shape would broadcast into a wrong gradient (a (3,4) dout over a (2,3,4) output)."""
    sm = L.Softmax()
    x = rng.standard_normal((2, 3, 4))
    out = sm(x)
    for wrong in ((2, 3, 5), (3, 4)):
        with pytest.raises(ValueError, match=r"Softmax.backward: dout must have the shape of the forward's output "
                                             rf"\(2, 3, 4\), got \({wrong[0]}, "):
            sm.backward(np.ones(wrong))
    dout = rng.standard_normal(out.shape)
    dx = sm.backward(dout)                                     # the refused backwards left the forward waiting
    np.testing.assert_allclose(dx, out * (dout - (out * dout).sum(-1, keepdims=True)), rtol=1e-12)


def test_keep_dout_keeps_the_gradient_each_backward_receives(rng, float64):
    """Off by default (nothing is held between steps); on, a layer of each tier keeps the dout of its last backward."""
    for mha in (L.MultiHeadAttention(6, 3), mt.fast.layers.MultiHeadAttention(6, 3)):
        x = rng.standard_normal((2, 4, 6))
        mha.backward(rng.standard_normal(mha(x, x, x).shape))
        assert not hasattr(mha.attention, "dout")
        mha.attention.keep_dout = True
        for _ in range(2):
            dout = rng.standard_normal((2, 4, 6))
            mha(x, x, x)
            mha.backward(dout)
            dheads = mha.split_heads(dout @ mha.W_o.W.data.T)          # what W_o hands the heads   (B,H,T,Dv)
            np.testing.assert_array_equal(mha.attention.dout, dheads)
        assert not hasattr(mha.W_o, "dout")


def _classes(module):
    return [getattr(module, name) for name in module.__all__
            if isinstance(getattr(module, name), type) and issubclass(getattr(module, name), mt.Module)]


@pytest.mark.parametrize("cls", _classes(mt.layers) + _classes(mt.model), ids=lambda c: c.__name__)
def test_layers_are_their_own_code(cls):
    """forward and backward are the methods written in the class's own file, not wrappers installed around
    them: reading a layer's file is reading what runs."""
    home = inspect.getsourcefile(cls)
    assert home.endswith("model.py") if cls.__module__ == "minitransformer.model" else "layers" in home
    for method in ("forward", "backward"):
        fn = cls.__dict__.get(method)
        assert fn is not None, f"{cls.__name__} does not define {method}"
        assert inspect.getsourcefile(getattr(cls, method)) == home, f"{cls.__name__}.{method}"
        assert fn.__qualname__ == f"{cls.__name__}.{method}" and not hasattr(fn, "__wrapped__")


def test_a_subclass_may_call_the_parents_forward_and_backward(rng, float64):
    """A subclass (as the fast tier's layers are) may call its parent's methods: the parent's cache serves."""

    class SummedLinear(L.Linear):                               # out = sum_j (x W + b)_j   (B,)
        def forward(self, x):
            return super().forward(x).sum(axis=-1)

        def backward(self, dout):                               # dout (B,) -> the parent's (B, out)
            return super().backward(np.repeat(dout[:, None], self.out_features, axis=1))

    layer = SummedLinear(4, 3)
    x = rng.standard_normal((2, 4))
    out = layer(x)
    assert out.shape == (2,)
    dx = layer.backward(np.ones(2))
    np.testing.assert_allclose(dx, np.tile(layer.W.data.sum(axis=1), (2, 1)), rtol=1e-12)   # dx = 1 W^T
    with pytest.raises(RuntimeError, match="SummedLinear.backward: there is no forward"):
        layer.backward(np.ones(2))
    layer(x)                                                    # and the next training forward may run


def test_train_eval_recurse():
    ffn = L.PositionwiseFeedForward(4, 6, dropout=0.5)
    ffn.eval()
    assert all(not m.training for m in ffn.modules())
    ffn.train()
    assert all(m.training for m in ffn.modules())


def test_state_dict_round_trip_and_shape_check():
    a, b = L.PositionwiseFeedForward(4, 6), L.PositionwiseFeedForward(4, 6)
    b.load_state_dict(a.state_dict())
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2
        np.testing.assert_array_equal(p1.data, p2.data)
    with pytest.raises(ValueError, match=r"parameter 'W1.W' must have shape \(4, 6\), got \(4, 5\)"):
        b.load_state_dict({**a.state_dict(), "W1.W": np.zeros((4, 5))})
    with pytest.raises(ValueError, match=r"missing keys \['W2.b'\]"):
        b.load_state_dict({k: v for k, v in a.state_dict().items() if k != "W2.b"})


def test_state_dict_is_a_copy():
    lin = L.Linear(2, 2)
    sd = lin.state_dict()
    sd["W"][...] = 7
    assert not np.all(lin.W.data == 7)


def test_default_dtype_and_seed():
    mt.set_default_dtype("float64")
    assert L.Linear(2, 3).W.data.dtype == np.float64
    mt.set_default_dtype("float32")
    assert L.Linear(2, 3).W.data.dtype == np.float32
    mt.manual_seed(7)
    w1 = L.Linear(5, 5).W.data.copy()
    mt.manual_seed(7)
    np.testing.assert_array_equal(w1, L.Linear(5, 5).W.data)
    with pytest.raises(ValueError, match="set_default_dtype: dtype must be one of"):
        mt.set_default_dtype("int8")
    with pytest.raises(ValueError, match="manual_seed: seed must be a non-negative int"):
        mt.manual_seed(-1)


def test_backend_switch_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"set_backend: name must be one of \('numpy', 'cupy'\), got 'jax'"):
        mt.set_backend("jax")
    monkeypatch.setitem(sys.modules, "cupy", None)                # import cupy now raises ImportError
    with pytest.raises(ImportError, match="pip install 'minitransformer\\[gpu\\]'"):
        mt.set_backend("cupy")
    assert mt.get_backend() == "numpy"


class _CUDARuntimeError(RuntimeError):
    pass


def _cupy_without_gpu(get_device_count):
    """A module shaped like CuPy where it is installed but reaches no GPU."""
    runtime = types.SimpleNamespace(CUDARuntimeError=_CUDARuntimeError, getDeviceCount=get_device_count)
    return types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(runtime=runtime))


def _no_driver():
    raise _CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")


@pytest.mark.parametrize("get_device_count, says", [
    (_no_driver, "cannot use a GPU: cudaErrorInsufficientDriver"),
    (lambda: 0, r"sees no GPU \(getDeviceCount\(\) is 0\)"),
])
def test_cupy_without_a_gpu_is_a_clear_error(monkeypatch, get_device_count, says):
    """CuPy imports on a machine without a usable GPU; the switch says so, rather than the first array
    failing deep inside CUDA, and the backend stays NumPy."""
    monkeypatch.setitem(sys.modules, "cupy", _cupy_without_gpu(get_device_count))
    with pytest.raises(RuntimeError, match=r"set_backend\('cupy'\): CuPy 14.2.0 is installed but " + says):
        mt.set_backend("cupy")
    assert mt.get_backend() == "numpy" and mt.backend.xp() is np


def test_real_cupy_without_a_gpu_is_a_clear_error():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("this machine has a GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pass
    with pytest.raises(RuntimeError, match=r"set_backend\('cupy'\): CuPy .* is installed but "):
        mt.set_backend("cupy")
    assert mt.get_backend() == "numpy"


def test_backend_from_environment_variable():
    import subprocess
    import sys
    code = "import minitransformer as mt; print(mt.get_backend())"
    env = {"MINITRANSFORMER_BACKEND": "numpy", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "numpy"
    bad = subprocess.run([sys.executable, "-c", code], env={**env, "MINITRANSFORMER_BACKEND": "tpu"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "set_backend: name must be one of" in bad.stderr


def test_to_numpy_returns_host_arrays():
    x = np.arange(3.0)
    assert mt.to_numpy(x) is x
    assert isinstance(mt.to_numpy(np.float32(2.0)), np.ndarray)


def test_to_numpy_knows_device_arrays_by_their_type_not_by_a_get_method():
    """A device array copies itself with .get(); other objects with a .get (a dict, a pandas Series,
    whose get takes a key) are converted as NumPy converts them, not called."""
    import fakecupy

    class SeriesLike:                                          # pandas.Series's get(key, default=None)
        def __init__(self, values):
            self.values = values

        def get(self, key, default=None):
            return default

        def __array__(self, dtype=None, copy=None):
            return np.asarray(self.values, dtype=dtype)

    np.testing.assert_array_equal(mt.to_numpy(SeriesLike([1.0, 2.0])), [1.0, 2.0])
    mt.set_backend(fakecupy)
    device = fakecupy.asarray(np.arange(3.0))
    mt.set_backend("numpy")                                    # back on the CPU: the device array still comes home
    host = mt.to_numpy(device)
    assert type(host) is np.ndarray and host.tolist() == [0.0, 1.0, 2.0]


def test_a_refused_rng_state_changes_nothing():
    mt.manual_seed(0)
    first = mt.backend.host_rng().random()
    mt.manual_seed(0)
    bad_states = [None, {}, {"host": 5}, {"host": {"bit_generator": "MT19937", "state": {}}},
                  {**mt.backend.get_rng_state(), "device": {"bit_generator": "PCG64"}}]
    for bad in bad_states:
        with pytest.raises(ValueError, match=r"set_rng_state: state"):
            mt.backend.set_rng_state(bad)
    assert mt.backend.host_rng().random() == first and mt.backend.get_rng_state()["seed"] == 0
