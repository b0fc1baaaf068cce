"""Step time of the fast tier with its two ways of using several cores, against PyTorch eager on the same CPU.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_parallel.py \
        [--presets tiny,small,base] [--kinds blas,workers,torch] [--cores 2] [--repeats N] [--steps N] \
        [--json out.json]

With C cores (default: those this process may use), for each preset of benchmarks/bench_step.py (its batch
and model):

    single    one model, the whole batch, one BLAS thread: one core (the command line's choice for models
              narrower than 256, and the measure of what the other two gain)
    blas      one model, the whole batch, C BLAS threads: each matrix product spread over the cores,
              everything else (softmax, LayerNorm, dropout, the loss, Python) on one
    workers   ``mt.fast.DataParallel`` with C workers of one BLAS thread each: the batch split in C parts,
              every part's whole step (products, elementwise work and Python alike) on a core of its own
    torch     torch.nn.Transformer dressed as ours (bench_step.TorchWorker), torch.set_num_threads(C)

Each runs in a subprocess of its own, interleaved (blas, workers, torch, blas, ...), each run timing a few
full float32 training steps (forward, label-smoothed loss, backward, Adam, zero_grad). The ratios
workers/blas and each to torch are printed per round and as the median over rounds: on a shared machine
the ratios within a round are the figure, and the load average printed at the start and end says how busy
the machine was. Each kind's matrix-product rate (GFLOP/s, counted as bench_step.py counts it: the padding
skipped for ours, every position for torch) is printed as a fraction of the float32 matmul peak with the
same cores, measured first in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_step  # its presets, batches and torch model

KINDS = ("single", "blas", "workers", "torch")


class FastWorker:
    """The fast tier's step, on the whole batch (workers=1) or split by DataParallel across `workers`."""

    def __init__(self, preset: str, cores: int, workers: int):
        sys.path.insert(0, ROOT)
        import minitransformer as mt

        mt.fast.set_num_threads(cores)                         # Adam's update and the workers' pool
        mt.fast.threads.set_blas_threads(cores if workers == 1 else 1)
        mt.set_default_dtype("float32")
        mt.manual_seed(0)
        cfg = mt.TransformerConfig.from_dict(bench_step.model_config(preset))
        self.model = mt.fast.Transformer(cfg)
        self.loss_fn = mt.fast.CrossEntropyLoss(ignore_index=bench_step.PAD, label_smoothing=bench_step.LABEL_SMOOTHING)
        self.opt = mt.fast.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.parallel = mt.fast.DataParallel(self.model, self.loss_fn, workers) if workers > 1 else None
        self.src, self.tgt_in, self.tgt_out = bench_step.make_batch(preset)
        self.info = {"workers": workers, "blas_threads": mt.fast.threads.blas_threads(), "threads": cores}

    def step(self) -> float:
        if self.parallel is None:
            loss = self.loss_fn(self.model(self.src, self.tgt_in), self.tgt_out)
            self.model.backward(self.loss_fn.backward())
        else:
            loss = self.parallel.forward(self.src, self.tgt_in, self.tgt_out)
            self.parallel.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


def worker_main(kind: str, preset: str, cores: int) -> None:
    out, sys.stdout = sys.stdout, sys.stderr                   # stray prints go to stderr
    if kind == "torch":
        worker = bench_step.TorchWorker(preset, cores)
    else:
        worker = FastWorker(preset, 1 if kind == "single" else cores, workers=cores if kind == "workers" else 1)
    out.write(json.dumps({"ready": True, **worker.info}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return
        times = []
        for _ in range(cmd["steps"]):
            t0 = time.perf_counter()
            loss = worker.step()
            times.append(time.perf_counter() - t0)
        out.write(json.dumps({"times": times, "loss": float(loss)}) + "\n")
        out.flush()


class Worker:
    def __init__(self, kind: str, preset: str, cores: int):
        # OpenBLAS sizes its thread pool from the environment when it loads: the cores, for every kind.
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(cores), OMP_NUM_THREADS=str(cores))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", kind, "--presets", preset,
                                      "--cores", str(cores)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args[3]} died (exit code {self.proc.wait()}); see stderr above")
        return json.loads(line)

    def run(self, steps: int) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": "run", "steps": steps}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def step_gflop(preset: str) -> dict:
    """GFLOP of matrix products in one step of each kind: ours skip the padding, torch's run every position."""
    ours, every_position = bench_step.step_flops(bench_step.model_config(preset), *bench_step.make_batch(preset))
    return {"single": ours / 1e9, "blas": ours / 1e9, "workers": ours / 1e9, "torch": every_position / 1e9}


def bench_preset(preset: str, cores: int, repeats: int, steps: int, kinds, peak: float | None) -> dict:
    shape = bench_step.SHAPES[preset]
    print(f"\n== {preset}: batch {shape['batch']}, src {shape['src_len']}, tgt {shape['tgt_len']}, vocab "
          f"{shape['vocab']}; {steps} steps per run", flush=True)
    workers = {kind: Worker(kind, preset, cores) for kind in kinds}
    for w in workers.values():
        w.run(2)                                               # warm-up: allocations, thread pools
    rounds = []
    for i in range(repeats):
        medians = {kind: statistics.median(w.run(steps)["times"]) for kind, w in workers.items()}
        rounds.append(medians)
        print(f"  round {i + 1}: " + "   ".join(f"{k} {1e3 * t:8.1f} ms" for k, t in medians.items())
              + "".join(f"   {a}/{b} {r:.3f}" for a, b, r in ratios(medians)), flush=True)
    for w in workers.values():
        w.close()
    result = {kind: {"median_ms": 1e3 * statistics.median(r[kind] for r in rounds), "info": workers[kind].info}
              for kind in kinds}
    result["ratios"] = {f"{a}/{b}": statistics.median(ratio for r in rounds for x, y, ratio in ratios(r)
                                                        if (x, y) == (a, b))
                        for a, b, _ in ratios(rounds[0])}
    result["rounds"] = rounds
    print("  median: " + "   ".join(f"{k} {result[k]['median_ms']:.1f} ms" for k in kinds)
          + "".join(f"   {name} {r:.3f}" for name, r in result["ratios"].items()), flush=True)
    gflop = step_gflop(preset)
    for kind in kinds:
        result[kind]["gflops"] = gflop[kind] / (result[kind]["median_ms"] / 1e3)
        result[kind]["peak_fraction"] = None if peak is None else result[kind]["gflops"] / peak
    if peak is not None:
        print("  matmul GFLOP/s (% of the peak): " + "   ".join(
            f"{k} {result[k]['gflops']:.0f} ({100 * result[k]['peak_fraction']:.0f}%)" for k in kinds), flush=True)
    return result


def ratios(medians: dict) -> list:
    """(a, b, a/b) for workers/blas, workers/single, blas/torch and workers/torch, where both ran."""
    return [(a, b, medians[a] / medians[b]) for a, b in (("workers", "blas"), ("workers", "single"),
                                                         ("blas", "torch"), ("workers", "torch"))
            if a in medians and b in medians]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="tiny,small,base", help="comma-separated, from tiny,small,base")
    p.add_argument("--cores", type=int, default=None, help="cores to use (default: those this process may use)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds per preset")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: bench_step's per preset)")
    p.add_argument("--kinds", default="blas,workers,torch",
                   help=f"comma-separated, from {','.join(KINDS)} (torch is skipped where it is not installed)")
    p.add_argument("--no-peak", action="store_true", help="skip measuring the float32 matmul peak")
    p.add_argument("--json", default=None, help="write the results as JSON to this file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cores = args.cores or len(os.sched_getaffinity(0))
    if args.worker:
        worker_main(args.worker, args.presets, cores)
        return 0
    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    if not presets or any(s not in bench_step.SHAPES for s in presets):
        p.error(f"--presets: give some of {sorted(bench_step.SHAPES)}, got {args.presets!r}")
    for name, value in (("--cores", cores), ("--repeats", args.repeats), ("--steps", args.steps or 1)):
        if value < 1:
            p.error(f"{name} must be >= 1, got {value}")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) < len(kinds):
        p.error(f"--kinds: give some of {','.join(KINDS)}, each once, got {args.kinds!r}")
    import importlib.util

    if "torch" in kinds and importlib.util.find_spec("torch") is None:
        print("torch is not installed: its runs are skipped")
        kinds.remove("torch")
    print(f"{cores} cores; load average at the start {bench_step.load_average()}")
    peak = None if args.no_peak else bench_step.measure("peak", cores)["best_gflops"]
    if peak is not None:
        print(f"float32 matmul peak with {cores} threads: {peak:.0f} GFLOP/s")
    report = {"cores": cores, "load_start": bench_step.load_average(), "peak_gflops": peak, "presets": {}}
    for preset in presets:
        steps = args.steps or bench_step.SHAPES[preset]["steps"]
        report["presets"][preset] = bench_preset(preset, cores, args.repeats, steps, kinds, peak)
    report["load_end"] = bench_step.load_average()
    print(f"\nload average at the end {report['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
