"""Why the unscaled dot product at d_k = 128 trains ten times slower per step than the scaled one, with the same
arithmetic: its softmax saturates, and the weights it leaves behind underflow into float32's subnormal range
(below about 1.2e-38), which a CPU processes far more slowly than normal numbers.

Both models are experiments/attention_variants.py's key-value retrieval at d_k = 128, seed 0, each at the rate the
study chose for it; at a few steps this prints the milliseconds of that step (forward, backward, Adam) and the
fraction of the attention weights that are subnormal, side by side, and the ratio of the step times.

    python benchmarks/bench_subnormal.py              # 300 steps each, under a minute
    python benchmarks/bench_subnormal.py --steps 100
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))                           # the study's task and model

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
from models import Retrieval
from retrieval import RETRIEVAL, retrieval_batch

import minitransformer as mt


def subnormal_fraction(a) -> float:
    """The fraction of entries that are nonzero but below the smallest normal number of their dtype."""
    return float(((a != 0) & (numpy.abs(a) < numpy.finfo(a.dtype).tiny)).mean())


def train(kind: str, lr: float, steps: int, report: set) -> dict:
    """{step: (ms of that step, subnormal fraction of the attention weights)} at the steps in ``report``."""
    s = RETRIEVAL
    mt.manual_seed(0)
    model = Retrieval(s["num_keys"], s["num_values"], s["d_model"], 128, kind)
    opt = mt.optim.Adam(model.parameters(), lr=lr)
    loss_fn = mt.CrossEntropyLoss(ignore_index=-1)
    data = numpy.random.default_rng(0)
    out = {}
    for step in range(1, steps + 1):
        keys, values, queries, targets = retrieval_batch(data, s["batch"], s["n"], s["m"], s["num_keys"],
                                                         s["num_values"])
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(keys, values, queries), targets)
        model.backward(loss_fn.backward())
        opt.step()
        if step in report:
            out[step] = (1e3 * (time.perf_counter() - t0), subnormal_fraction(model.attention.attn))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args(argv)
    report = {1, 25, 50, 100, 200, 300, args.steps} & set(range(1, args.steps + 1))
    stored = json.loads((EXPERIMENTS / "results" / "attention_variants" / "results.json").read_text(encoding="utf-8"))
    runs = {kind: train(kind, stored["results"]["lrs"][f"{kind}/128"], args.steps, report) for kind in ("dot", "scaled")}
    print(f"d_k = 128, seed 0, {common.machine()['cpu']}, one BLAS thread")
    print(f"{'step':>5}  {'unscaled ms':>11}  {'subnormal':>9}  {'scaled ms':>9}  {'subnormal':>9}  {'ratio':>5}")
    for step in sorted(report):
        (t_dot, f_dot), (t_scaled, f_scaled) = runs["dot"][step], runs["scaled"][step]
        print(f"{step:5d}  {t_dot:11.1f}  {f_dot:9.1%}  {t_scaled:9.1f}  {f_scaled:9.1%}  {t_dot / t_scaled:5.1f}")


if __name__ == "__main__":
    main()
