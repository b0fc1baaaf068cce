"""benchmarks/bench_subnormal.py: what it counts as subnormal (the timings themselves are the benchmark's)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_subnormal


def test_subnormal_fraction_counts_nonzero_entries_below_the_smallest_normal():
    values = [0.0, 1e-39, 1e-30, 1.0]               # 1e-39 is below float32's smallest normal, 1.18e-38
    assert bench_subnormal.subnormal_fraction(np.array(values, dtype=np.float32)) == pytest.approx(0.25)
    assert bench_subnormal.subnormal_fraction(np.array(values, dtype=np.float64)) == 0.0    # normal in float64
