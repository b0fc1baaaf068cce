"""benchmarks/bench_step.py, the speed benchmark of issue 6: its GPU path is checked here on the CPU.

A GPU is lent to a session rarely and briefly, so the script that times the CuPy backend must work the first
time. ``--backend fakecupy`` runs that path (device synchronize, the device's memory, no torch, the GPU
targets) on tests/fakecupy.py, whose arrays refuse implicit copies to the host as CuPy's do. The timings
themselves are not tested: speed targets live in the benchmark's output, never in tests.
"""

import json
import os
import subprocess
import sys

import fakecupy
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_step


def test_the_benchmark_runs_on_the_stand_in_for_cupy(tmp_path):
    """The whole command as benchmarks/gpu.sh runs it, on the tiny preset: workers, peak, floor, decoding,
    the JSON and the Markdown with the GPU targets."""
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_step.py"), "--backend", "fakecupy",
         "--presets", "tiny", "--repeats", "1", "--steps", "1", "--decode-repeats", "1", "--threads", "1",
         "--cpu-base-ms", "5000", "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out_json.read_text())
    assert report["backend"] == "fakecupy" and report["cpu_base_ms"] == 5000
    tiny = report["presets"]["tiny"]
    assert "torch" not in tiny and tiny["pairs"] == []            # torch is not run on a device backend
    assert tiny["ours"]["backend"] == "fakecupy" and tiny["ours"]["median_ms"] > 0
    assert tiny["decode"]["same_tokens"] and tiny["decode"]["batch"] == bench_step.SHAPES["tiny"]["decode_batch"]
    assert tiny["matmul_floor"]["floor_ms"] > 0
    assert [name for name, _, _ in report["targets"]] == ["tiny cached greedy >= 3x naive (64 tokens)"]
    table = out_md.read_text()
    assert "backend fakecupy" in table and "| target (issue 6, GPU) |" in table


def test_a_benchmark_step_waits_for_the_device_and_copies_only_the_loss(monkeypatch):
    """On a device backend, a timed step ends with a synchronize, and its only device-to-host copy is the
    loss's (three numbers: loss, token count, bad targets)."""
    calls = []
    monkeypatch.setattr(bench_step, "synchronize", lambda xp: calls.append(xp))
    worker = bench_step.OursWorker("tiny", 1, backend="fakecupy")
    assert isinstance(worker.model.tgt_embed.weight.data, fakecupy.ndarray)   # the weights live on the device
    worker.step()                                               # the first step allocates; then count
    calls.clear()
    fakecupy.transfers.reset()
    loss = worker.step()
    assert calls == [fakecupy]
    assert np.isfinite(loss) and fakecupy.transfers.host_sizes == [3]


@pytest.mark.parametrize("gpu_ms, met", [(100.0, True), (200.0, False)])
def test_the_gpu_speedup_target_compares_with_the_cpu_step(gpu_ms, met):
    results = {"base": {"ours": {"median_ms": gpu_ms}}}
    targets = bench_step.targets(results, peak=1e5, backend="cupy", cpu_base_ms=4000.0)
    assert targets == [("base step >= 30x faster than on 2 CPU cores",
                        f"{4000 / gpu_ms:.1f}x (4000 ms there, {gpu_ms:.1f} ms here)", met)]
    assert bench_step.targets(results, peak=1e5, backend="cupy") == []   # no CPU figure: no verdict


def test_backend_cupy_without_cupy_stops_before_any_worker(monkeypatch, capsys):
    """`--backend cupy` where CuPy cannot run says why at once (an argument error naming the option), rather
    than a worker dying on a CUDA error after the CPU part of the run."""
    monkeypatch.setitem(sys.modules, "cupy", None)                # import cupy raises ImportError
    monkeypatch.setattr(bench_step, "run", lambda *args: pytest.fail("workers started"))
    with pytest.raises(SystemExit) as stop:
        bench_step.main(["--backend", "cupy", "--presets", "tiny"])
    assert stop.value.code == 2
    assert "--backend cupy: set_backend('cupy') needs CuPy, which is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),              # 0 once meant "the preset's default"
    (["--presets", ","], "--presets: give at least one of"),
    (["--decode-repeats", "-1"], "--decode-repeats must be >= 0"),
    (["--json", "/nonexistent-folder/x.json"], "--json: the folder of /nonexistent-folder/x.json does not exist"),
])
def test_bad_arguments_stop_before_any_worker(args, message, monkeypatch, capsys):
    monkeypatch.setattr(bench_step, "run", lambda *a: pytest.fail("workers started"))
    with pytest.raises(SystemExit) as stop:
        bench_step.main(["--presets", "tiny", *args] if args[0] != "--presets" else args)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_workers_get_the_thread_count_in_their_environment(monkeypatch):
    """BLAS reads it at start-up, so a worker runs on the asked-for threads even without threadpoolctl."""
    seen = {}

    class FakePopen:
        def __init__(self, args, env=None, **kwargs):
            seen.update(env)

    monkeypatch.setattr(bench_step.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(bench_step.Worker, "_read", lambda self: {})
    bench_step.Worker("ours", "tiny", 3)
    assert {seen[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")} == {"3"}
