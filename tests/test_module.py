"""Module and Parameter bookkeeping, and the backend switch."""

import os
import signal
import sys
import time
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


def test_second_forward_without_backward_raises_in_training_only(rng):
    mha = L.MultiHeadAttention(4, 2)
    x = rng.standard_normal((1, 2, 4)).astype(np.float32)
    mha(x, x, x)
    with pytest.raises(RuntimeError, match="forward was called twice in training mode"):
        mha(x, x, x)
    mha.eval()
    mha(x, x, x)
    mha(x, x, x)                                           # inference: any number of forwards


# Each layer, built and called as (module, inputs); its output is one array.
LAYERS = {
    "Linear": lambda rng: (L.Linear(4, 3), (rng.standard_normal((2, 5, 4)),)),
    "Embedding": lambda rng: (L.Embedding(9, 4), (np.array([[1, 2, 3], [4, 0, 0]]),)),
    "PositionalEncoding": lambda rng: (L.PositionalEncoding(4, max_len=8), (rng.standard_normal((2, 5, 4)),)),
    "LearnedPositionalEmbedding": lambda rng: (L.LearnedPositionalEmbedding(8, 4), (rng.standard_normal((2, 5, 4)),)),
    "ReLU": lambda rng: (L.ReLU(), (rng.standard_normal((2, 5, 4)),)),
    "Softmax": lambda rng: (L.Softmax(), (rng.standard_normal((2, 3, 4)),)),
    "Mask": lambda rng: (L.Mask(), (rng.standard_normal((1, 2, 3, 3)), np.tril(np.ones((3, 3), dtype=bool)))),
    "Dropout": lambda rng: (L.Dropout(0.5), (rng.standard_normal((2, 5, 4)),)),
    "LayerNorm": lambda rng: (L.LayerNorm(4), (rng.standard_normal((2, 5, 4)),)),
    "PositionwiseFeedForward": lambda rng: (L.PositionwiseFeedForward(4, 6, dropout=0.5), (rng.standard_normal((2, 5, 4)),)),
    "ScaledDotProductAttention": lambda rng: (L.ScaledDotProductAttention(),
                                              tuple(rng.standard_normal((1, 2, 3, 4)) for _ in range(3))),
    "MultiHeadAttention": lambda rng: (L.MultiHeadAttention(4, 2), (rng.standard_normal((2, 3, 4)),) * 3),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_forward_allows_one_backward_of_its_shape(name, rng, float64):
    """A backward with no forward, a second backward for one forward and a dout of another shape are errors,
    never a gradient: Mask's second backward used to return zeros, Dropout's the unscaled dout, Softmax's
    broadcast a (3,4) dout over a (2,3,4) output, and the others failed with bare NumPy or attribute errors."""
    module, inputs = LAYERS[name](rng)
    with pytest.raises(RuntimeError, match=rf"{name}.backward: there is no forward to go back through"):
        module.backward(np.ones((2, 3)))
    out = module(*inputs)
    for wrong in ((*out.shape[:-1], out.shape[-1] + 1), out.shape[1:]):
        with pytest.raises(ValueError, match=rf"{name}.backward: dout must have the shape of the forward's "
                                             rf"output \({out.shape[0]}, .*got \({wrong[0]}, "):
            module.backward(np.ones(wrong))
    module.backward(np.ones(out.shape))                        # a refused backward left the forward waiting
    grads = {n: p.grad.copy() for n, p in module.named_parameters()}
    with pytest.raises(RuntimeError, match="each forward allows one backward"):
        module.backward(np.ones(out.shape))
    for n, p in module.named_parameters():                     # and the refused one added nothing
        np.testing.assert_array_equal(p.grad, grads[n], err_msg=n)
    module.eval()
    module(*inputs)
    module(*inputs)                                            # eval: forwards without backward; the last one
    module.backward(np.ones(out.shape))                        # may still be gone back through, once


def test_a_direct_forward_allows_its_backward_too(rng, float64):
    """DESIGN: forward(*inputs), also via __call__, caches what backward needs: module.forward(x) counts."""
    lin = L.Linear(4, 3)
    out = lin.forward(rng.standard_normal((2, 4)))
    lin.backward(np.ones(out.shape))
    with pytest.raises(RuntimeError, match="each forward allows one backward"):
        lin.backward(np.ones(out.shape))
    with pytest.raises(ValueError, match=r"Linear.backward: dout must have the shape .* \(2, 3\), got \(2, 4\)"):
        lin.forward(rng.standard_normal((2, 4)))
        lin.backward(dout=np.ones((2, 4)))                      # given by keyword, checked as well


def test_a_subclass_may_call_the_parents_forward_and_backward(rng, float64):
    """The parent's methods run inside the subclass's: only the subclass's own output shape and dout count."""

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
    with pytest.raises(ValueError, match=r"parameter 'W1.W' expects shape \(4, 6\), got \(4, 5\)"):
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


@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (0, 4), (512, 1031)])
def test_random_uint16_shape_dtype_and_reproducible(shape):
    mt.manual_seed(3)
    a = mt.backend.random_uint16(shape)
    mt.manual_seed(3)
    b = mt.backend.random_uint16(shape)
    assert a.shape == shape and a.dtype == np.uint16
    np.testing.assert_array_equal(a, b)
    if a.size > 1:
        assert not np.array_equal(a, mt.backend.random_uint16(shape))    # the next call draws new numbers


def test_random_uint16_is_uniform_and_its_neighbours_independent():
    # The CPU path cuts four 16-bit integers from each 64-bit draw: every bit, every value range and every
    # pair of neighbours (inside one word and across words) must look like independent uniform draws.
    mt.manual_seed(0)
    n = 1 << 22
    r = mt.backend.random_uint16((n,)).astype(np.int64)
    bits = (r[:, None] >> np.arange(16)) & 1                             # (n, 16)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 5 * 0.5 / np.sqrt(n))   # 5 sigma per bit
    counts = np.bincount(r >> 8, minlength=256)                          # the high byte: 256 equal bins
    expected = n / 256
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 255 + 6 * np.sqrt(2 * 255)                             # chi-square, 255 dof, ~6 sigma
    for position in range(4):                                            # each quarter of the 64-bit words
        quarter = r[position::4]
        assert abs(quarter.mean() - 32767.5) < 5 * 18918 / np.sqrt(quarter.size)   # std of U{0..65535}
    x = (r - 32767.5) / 18918.6
    for lag in (1, 2, 3, 4, 5):
        assert abs(np.mean(x[:-lag] * x[lag:])) < 5 / np.sqrt(n)         # correlation of neighbours ~ 0


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


def test_thread_count_from_the_environment_and_checked():
    import subprocess
    import sys
    code = "import minitransformer as mt; print(mt.backend.get_num_threads())"
    base = {"PATH": "/usr/bin:/bin"}
    for env, expected in (({"MINITRANSFORMER_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, "3"),
                          ({"OPENBLAS_NUM_THREADS": "1"}, "1"),
                          ({"OMP_NUM_THREADS": "5", "OPENBLAS_NUM_THREADS": "1"}, "5")):
        out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == expected, env
    for bad in (0, -1, 1.5, "2", True, None):
        with pytest.raises(ValueError, match=r"set_num_threads: n must be a positive int, got"):
            mt.backend.set_num_threads(bad)


def test_parallel_map_keeps_order_and_really_runs_concurrently():
    import threading
    mt.backend.set_num_threads(3)
    # Each call waits until three calls are inside it at once: run one after another, they would time out.
    barrier = threading.Barrier(3, timeout=10)

    def work(i):
        barrier.wait()
        return i * i, threading.current_thread().name

    results = mt.backend.parallel_map(work, range(3))
    assert [r[0] for r in results] == [0, 1, 4]
    assert len({r[1] for r in results}) == 3
    # Called from inside a parallel_map (every pool thread busy with the outer call), it runs inline.
    mt.backend.set_num_threads(2)
    both_busy = threading.Barrier(2, timeout=10)

    def outer(i):
        both_busy.wait()                                       # both pool threads are in an outer call now
        return mt.backend.parallel_map(lambda j: i * 10 + j, range(3))

    nested = []
    caller = threading.Thread(target=lambda: nested.append(mt.backend.parallel_map(outer, range(2))), daemon=True)
    caller.start()
    caller.join(timeout=20)
    assert not caller.is_alive(), "a parallel_map inside a parallel_map waited for itself"
    assert nested == [[[0, 1, 2], [10, 11, 12]]]
    mt.backend.set_num_threads(1)                             # one thread: the plain loop, in this thread
    assert mt.backend.parallel_map(lambda i: threading.current_thread().name, range(3)) == \
        [threading.current_thread().name] * 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
# Python 3.12+ warns at any fork of a process with threads: forking with the pool's threads alive is the point here.
@pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning")
def test_parallel_map_works_in_a_forked_child():
    # The parent's pool exists (and its threads do not, in the child): the child must not wait for them.
    mt.backend.set_num_threads(2)
    assert mt.backend.parallel_map(lambda i: i + 1, range(4)) == [1, 2, 3, 4]
    pid = os.fork()
    if pid == 0:                                               # the child: exit 0 only if the work got done
        ok = mt.backend.parallel_map(lambda i: i + 1, range(4)) == [1, 2, 3, 4]
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("parallel_map hung in a forked child")


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
