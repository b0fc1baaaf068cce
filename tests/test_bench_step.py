"""benchmarks/bench_step.py, the speed benchmark of both tiers: its GPU path is checked here on the CPU.

A GPU is rarely at hand, so the script that times the CuPy backend must work the first time it meets one.
``--backend fakecupy`` runs that path (device synchronize, the device's memory, no torch, the GPU targets)
for the fast and the core tier on tests/fakecupy.py, whose arrays refuse implicit copies to the host as
CuPy's do. The timings themselves are not tested: speed targets live in the benchmark's output, never in
tests.
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
    """The whole command as benchmarks/gpu.sh runs it, on the tiny preset: a worker per tier, peak, floor,
    decoding, the JSON and the Markdown with the GPU targets."""
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_step.py"), "--backend", "fakecupy",
         "--presets", "tiny", "--repeats", "1", "--steps", "1", "--decode-repeats", "1", "--threads", "1",
         "--cpu-base-ms", "5000", "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out_json.read_text())
    assert report["backend"] == "fakecupy" and report["cpu_base_ms"] == 5000
    assert report["tiers"] == ["fast", "core"]                    # both by default
    tiny = report["presets"]["tiny"]
    assert "torch" not in tiny and "ratio_median" not in tiny     # torch is not run on a device backend
    for key, tier in (("ours", "fast"), ("core", "core")):        # the fast tier's figures under "ours"
        assert tiny[key]["tier"] == tier and tiny[key]["backend"] == "fakecupy" and tiny[key]["median_ms"] > 0
    (only_round,) = tiny["pairs"]                                 # one round: fast then core
    assert set(only_round) == {"ours_ms", "core_ms", "core_over_fast"}
    assert only_round["core_over_fast"] == pytest.approx(only_round["core_ms"] / only_round["ours_ms"])
    assert tiny["core_over_fast_median"] == only_round["core_over_fast"]
    assert tiny["decode"]["tier"] == "fast" and tiny["decode"]["same_tokens"]
    assert tiny["decode"]["batch"] == bench_step.SHAPES["tiny"]["decode_batch"]
    assert tiny["matmul_floor"]["floor_ms"] > 0
    assert [name for name, _, _ in report["targets"]] == ["tiny cached greedy >= 3x naive (64 tokens)"]
    assert "core/fast" in proc.stdout and "fast " in proc.stdout and "core " in proc.stdout
    table = out_md.read_text()
    assert "backend fakecupy" in table and "| target (fast tier, GPU) |" in table
    assert "| fast ms | core ms | torch ms |" in table


@pytest.mark.parametrize("tier", ["fast", "core"])
def test_a_benchmark_step_waits_for_the_device_and_copies_only_the_loss(monkeypatch, tier):
    """Each tier's worker steps its own model, loss and Adam. On a device backend a timed step ends with a
    synchronize, and its only device-to-host copies are the loss's scalars (its check for bad targets, its
    token count and its value): no activation, no gradient."""
    import minitransformer as mt

    calls = []
    monkeypatch.setattr(bench_step, "synchronize", lambda xp: calls.append(xp))
    worker = bench_step.OursWorker("tiny", 1, backend="fakecupy", tier=tier)
    expected = {"fast": (mt.fast.Transformer, mt.fast.CrossEntropyLoss, mt.fast.Adam),
                "core": (mt.Transformer, mt.CrossEntropyLoss, mt.optim.Adam)}[tier]
    assert tuple(type(x) for x in (worker.model, worker.loss_fn, worker.opt)) == expected
    assert worker.info["tier"] == tier
    assert isinstance(worker.model.tgt_embed.weight.data, fakecupy.ndarray)   # the weights live on the device
    worker.step()                                               # the first step allocates; then count
    calls.clear()
    fakecupy.transfers.reset()
    loss = worker.step()
    assert calls == [fakecupy]
    assert np.isfinite(loss) and fakecupy.transfers.host_sizes == [1, 1, 1]


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
    (["--tiers", "fast,gpu"], "--tiers: give one or both of fast,core, each once, got fast,gpu"),
    (["--tiers", "core,core"], "--tiers: give one or both of fast,core, each once, got core,core"),
])
def test_bad_arguments_stop_before_any_worker(args, message, monkeypatch, capsys):
    monkeypatch.setattr(bench_step, "run", lambda *a: pytest.fail("workers started"))
    with pytest.raises(SystemExit) as stop:
        bench_step.main(["--presets", "tiny", *args] if args[0] != "--presets" else args)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("tiers, expected", [(None, ["fast", "core"]), ("core", ["core"]),
                                             (" core , fast", ["core", "fast"])])
def test_tiers_reach_the_run(tiers, expected, monkeypatch):
    seen = []
    monkeypatch.setattr(bench_step, "run", lambda presets, threads, args, *rest: seen.append(args.tiers) or {})
    monkeypatch.setattr(bench_step, "markdown", lambda report: "")
    bench_step.main(["--presets", "tiny", "--threads", "1", *(["--tiers", tiers] if tiers else [])])
    assert seen == [expected]


def fake_result(**present):
    """One preset's figures as bench_preset gives them, for the implementations named (JSON keys)."""
    figures = {"median_ms": 10.0, "gflops": 5.0, "tokens_per_s": 1e3, "memory": {"step_mb": 20.0}}
    return {"shape": {"batch": 2, "src_len": 3, "tgt_len": 4, "vocab": 5}, "padding": {"src": 0.1, "tgt_in": 0.2},
            **{key: dict(figures, median_ms=ms) for key, ms in present.items()}}


def test_the_table_and_the_targets_take_any_choice_of_tiers():
    """The core alone (no fast figures, so no fast targets), and both tiers with torch: each cell where
    its figures are, "-" elsewhere."""
    presets = {"small": fake_result(core=30.0, torch=12.0), "base": fake_result(ours=8.0, core=24.0, torch=10.0)}
    report = {"backend": "numpy", "threads": 1, "date": "d", "machine": {"model": "m", "cpus": 1}, "numpy": "n",
              "blas_kernel": "k", "peak_gflops": 100.0, "peak_runs": [{"n": 8}], "presets": presets}
    report["presets"]["small"].update(core_ratio_median=2.5)
    report["presets"]["base"].update(ratio_median=0.8, ratio_torch_fastest=0.75, core_ratio_median=2.4,
                                     core_over_fast_median=3.0)
    report["targets"] = bench_step.targets(report["presets"], peak=100.0)
    assert [name for name, _, _ in report["targets"]] == [
        "base step <= 0.8x torch", "base step <= 0.8x torch, rounds where torch ran fastest",
        "base step >= 50% of matmul peak", "base step memory <= torch's"]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in bench_step.markdown(report).splitlines()
            if line.startswith(("| small", "| base"))}
    assert rows["| small"][2:9] == ["-", "30.0", "12.0", "-", "-", "2.50x", "-"]
    assert rows["| base"][2:9] == ["8.0", "24.0", "10.0", "0.80x", "0.75x", "2.40x", "3.00x"]
    assert rows["| small"][13] == "- / 20 / 20 MB" and rows["| base"][13] == "20 / 20 / 20 MB"


def test_workers_get_the_thread_count_in_their_environment(monkeypatch):
    """BLAS reads it at start-up, so a worker runs on the asked-for threads even without threadpoolctl."""
    seen = {}

    class FakePopen:
        def __init__(self, args, env=None, **kwargs):
            seen.update(env)

    monkeypatch.setattr(bench_step.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(bench_step.Worker, "_read", lambda self: {})
    bench_step.Worker("fast", "tiny", 3)
    assert {seen[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")} == {"3"}
