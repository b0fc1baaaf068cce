"""benchmarks/bench_parallel.py, the step on both cores against PyTorch: the script runs and its report adds up.

The timings themselves are not tested (speed targets live in the benchmark's output, never in tests); what is
tested is that every kind runs, and that the ratios and the fraction of the matmul peak are computed from the
medians the report holds.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_parallel
import bench_step


def test_the_benchmark_runs_one_model_and_two_workers_on_the_tiny_preset(tmp_path):
    out_json = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_parallel.py"), "--presets", "tiny",
         "--kinds", "single,workers", "--cores", "2", "--repeats", "2", "--steps", "1", "--json", str(out_json)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out_json.read_text())
    assert report["cores"] == 2 and report["peak_gflops"] > 0
    tiny = report["presets"]["tiny"]
    assert tiny["single"]["info"]["workers"] == 1 and tiny["workers"]["info"]["workers"] == 2
    assert tiny["workers"]["info"]["blas_threads"] == 1
    assert len(tiny["rounds"]) == 2
    ratios = [r["workers"] / r["single"] for r in tiny["rounds"]]
    assert tiny["ratios"]["workers/single"] == pytest.approx(sum(ratios) / 2)  # the median of two
    gflop = bench_parallel.step_gflop("tiny")["workers"]
    assert tiny["workers"]["gflops"] == pytest.approx(gflop / (tiny["workers"]["median_ms"] / 1e3))
    assert tiny["workers"]["peak_fraction"] == pytest.approx(tiny["workers"]["gflops"] / report["peak_gflops"])
    assert "% of the peak" in proc.stdout


def test_the_step_flop_count_skips_the_padding_only_for_our_tiers():
    """Ours run the position-wise products on the real tokens only, torch on every position: for the same
    batch, fewer FLOPs for ours, and exactly bench_step's count for each."""
    gflop = bench_parallel.step_gflop("small")
    src, _, tgt_out = bench_step.make_batch("small")
    cfg, (B, S), T = bench_step.model_config("small"), src.shape, tgt_out.shape[1]
    assert gflop["torch"] * 1e9 == bench_step.matmul_flops(bench_step.step_matmuls(cfg, B, S, T))
    assert gflop["single"] == gflop["blas"] == gflop["workers"] < gflop["torch"]
