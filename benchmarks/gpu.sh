#!/usr/bin/env bash
# The CuPy backend on a GPU, in one prepared run (issue 6): prove it correct, then time it.
#
#   bash benchmarks/gpu.sh                      # from anywhere; on the lent GPU machine, via the device tool:
#                                               # run(command="bash benchmarks/gpu.sh", timeout_s=600)
#
# 1. environment: GPU, driver, Python, NumPy, CuPy (installs cupy-cuda12x when no CuPy build is there:
#    from PyPI, or offline from wheels in .whl/ carried along, see /work/.library/device/README.md);
# 2. the gradient checks of every layer on the cupy backend (MINITRANSFORMER_BACKEND=cupy; conftest keeps
#    the session's backend); then, from NumPy, the device-boundary tests (training step, evaluation, decoding,
#    gradcheck and Trainer on CuPy against NumPy) and the loss/optimiser CuPy tests;
# 3. the float32 training step on CuPy for tiny, small and base at issue 6's batch shapes: through
#    benchmarks/bench_step.py when it has a --backend flag, else the timer below. Table on stdout, JSON and
#    Markdown in $OUT (or benchmarks/gpu-results/ where OUT is unset).
#
# Settings (environment): PYTHON (python3), PRESETS (tiny,small,base), STEPS (timed steps per preset, 20),
# BENCH_ARGS (extra bench_step.py arguments, default --no-torch), CPU_BASE_MS (the base step on 2 CPU cores,
# from the README's table: prints the GPU speed-up against issue 6's 30x target), GPU_BENCH
# (auto | bench_step | inline). Every stage runs even if an earlier one failed; the exit status is 0 only if
# all passed. Expect about 3-5 minutes on an H200, much of it CuPy compiling its kernels on a fresh machine;
# each stage has its own time limit (150 + 150 + 240 s), so that the whole stays inside one 600 s device call
# and a stuck stage still leaves the others' results in $OUT.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
PRESETS=${PRESETS:-tiny,small,base}
STEPS=${STEPS:-20}
GPU_BENCH=${GPU_BENCH:-auto}
OUT_DIR=${OUT:-benchmarks/gpu-results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 OUT_DIR PRESETS STEPS
stage() { printf '\n==== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

# Every stage, in order; main's output also goes to $OUT_DIR/gpu.log (the body is not indented: it holds
# heredocs, whose closing line must start the line).
main() {
status=0
stage "environment"
date -u +"%Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"
"$PYTHON" -c 'import sys, numpy; print("Python", sys.version.split()[0], "NumPy", numpy.__version__)' || exit 2

stage "CuPy"
if ! "$PYTHON" -c 'import cupy' 2>/dev/null; then
    echo "no CuPy here: installing cupy-cuda12x"
    if ! "$PYTHON" -m pip install -q cupy-cuda12x; then
        if [ -d .whl ] && "$PYTHON" -m pip install -q --no-index --find-links .whl cupy-cuda12x; then
            echo "installed from the carried wheels in .whl/"
        else
            echo "FAILED: pip could not install cupy-cuda12x (no network there?). Carry its wheel in .whl/"
            echo "(see /work/.library/device/README.md) or install the CuPy build matching the CUDA driver."
            exit 2
        fi
    fi
fi
"$PYTHON" - <<'PY' || exit 2
import cupy
n = cupy.cuda.runtime.getDeviceCount()
name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
name = name.decode() if isinstance(name, bytes) else name
print(f"CuPy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, {n} device(s): {name}")
assert n > 0, "CuPy sees no GPU"
assert float((cupy.arange(4.0) ** 2).sum()) == 14.0
PY

stage "gradient checks on the cupy backend"
MINITRANSFORMER_BACKEND=cupy timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs \
    tests/test_layers_gradcheck.py || { echo "FAILED: gradient checks on the cupy backend"; status=1; }

stage "CuPy against NumPy"
# These start on NumPy (their reference) and switch to CuPy themselves: no MINITRANSFORMER_BACKEND here.
timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_device_boundary.py \
    tests/test_loss.py::test_cupy_matches_numpy tests/test_optim.py::test_cupy_adam_and_clip_match_numpy \
    || { echo "FAILED: CuPy against NumPy"; status=1; }

stage "training step on CuPy"
if [ "$GPU_BENCH" = auto ]; then
    if "$PYTHON" benchmarks/bench_step.py --help 2>/dev/null | grep -q -- '--backend'; then
        GPU_BENCH=bench_step
    else
        echo "benchmarks/bench_step.py has no --backend flag: timing with the inline timer instead"
        GPU_BENCH=inline
    fi
fi
if [ "$GPU_BENCH" = bench_step ]; then
    read -r -a bench_args <<< "${BENCH_ARGS:---no-torch}"
    timeout 240 "$PYTHON" benchmarks/bench_step.py --backend cupy --presets "$PRESETS" "${bench_args[@]}" \
        --json "$OUT_DIR/bench_step_cupy.json" --markdown "$OUT_DIR/bench_step_cupy.md" \
        || { echo "FAILED: bench_step.py --backend cupy"; status=1; }
else
    timeout 240 "$PYTHON" - <<'PY' || { echo "FAILED: the inline GPU timer"; status=1; }
"""Median time of one float32 training step (forward, label-smoothed loss, backward, Adam, zero_grad) on CuPy,
as benchmarks/bench_step.py times it on the CPU: same presets, batch shapes, tied embeddings, dropout and
Adam settings. Each timed step ends with a device synchronize (the GPU runs asynchronously); "pipelined" is
the mean over steps run back to back with one synchronize at the end. FLOPs: matrix products only, 3x the
forward's. Memory: what CuPy's pool holds after the steps (weights, grads, Adam, activations, cached blocks)."""
import datetime
import json
import math
import os
import statistics
import time

import cupy
import numpy

import minitransformer as mt

PAD, BOS, EOS, FIRST_SYMBOL, DECODE_LEN = 0, 1, 2, 4, 64
# vocab V, batch B, source S, target T, decoding batch: issue 6's shapes (as in bench_step.py)
SHAPES = {"tiny": (14, 64, 12, 11, 16), "small": (8000, 64, 16, 18, 16), "base": (16000, 32, 32, 32, 8)}
out_dir, steps = os.environ["OUT_DIR"], int(os.environ["STEPS"])
presets = [p.strip() for p in os.environ["PRESETS"].split(",") if p.strip()]


def sync():
    cupy.cuda.Device().synchronize()


def make_batch(V, B, S, T, seed=0):
    """Host int64 src (B,S), tgt_in (B,T), tgt_out (B,T), padded at the end, lengths in [0.6 L, L]."""
    rng = numpy.random.default_rng(seed)
    src = numpy.full((B, S), PAD, dtype=numpy.int64)
    tgt = numpy.full((B, T + 1), PAD, dtype=numpy.int64)
    for b in range(B):
        n_src = int(rng.integers(math.ceil(0.6 * S), S + 1))
        src[b, :n_src - 1] = rng.integers(FIRST_SYMBOL, V, size=n_src - 1)
        src[b, n_src - 1] = EOS
        n_tgt = int(rng.integers(math.ceil(0.6 * T), T + 1))
        tgt[b, 0] = BOS
        tgt[b, 1:n_tgt] = rng.integers(FIRST_SYMBOL, V, size=n_tgt - 1)
        tgt[b, n_tgt] = EOS
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def step_flops(c, B, S, T):
    D, F, V = c.d_model, c.d_ff, c.tgt_vocab_size
    Ns, Nt = B * S, B * T
    enc = 4 * 2 * Ns * D * D + 2 * 2 * B * S * S * D + 2 * 2 * Ns * D * F
    dec = (4 * 2 * Nt * D * D + 2 * 2 * B * T * T * D + 2 * 2 * Nt * D * D + 2 * 2 * Ns * D * D
           + 2 * 2 * B * T * S * D + 2 * 2 * Nt * D * F)
    return 3 * (c.num_encoder_layers * enc + c.num_decoder_layers * dec + 2 * Nt * D * V)


def matmul_peak(n=8192, repeats=10):
    a = cupy.random.default_rng(0).random((n, n), dtype=cupy.float32)
    b = cupy.random.default_rng(1).random((n, n), dtype=cupy.float32)
    a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2.0 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


props = cupy.cuda.runtime.getDeviceProperties(0)
gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
peak = matmul_peak()
print(f"{gpu}: float32 matmul (n=8192, cuBLAS) {peak:.1f} TFLOP/s")
mt.set_backend("cupy")
mt.set_default_dtype("float32")
pool = cupy.get_default_memory_pool()
results = {}
for preset in presets:
    V, B, S, T, B_decode = SHAPES[preset]
    pool.free_all_blocks()
    mt.manual_seed(0)
    cfg = mt.TransformerConfig.preset(preset, src_vocab_size=V, tgt_vocab_size=V, max_len=max(S, T, DECODE_LEN) + 2)
    model = mt.Transformer(cfg)
    loss_fn = mt.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    opt = mt.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out = make_batch(V, B, S, T)        # host ids, as a data loader gives them

    def step():
        loss = loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
        return loss

    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0                      # includes compiling CuPy's kernels
    for _ in range(2):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    pipelined = (time.perf_counter() - t0) / steps
    med = statistics.median(times)
    tokens = int((src != PAD).sum() + (tgt_out != PAD).sum())
    flops = step_flops(cfg, B, S, T)
    r = {"shape": {"vocab": V, "batch": B, "src_len": S, "tgt_len": T}, "parameters": model.num_parameters(),
         "median_ms": 1e3 * med, "min_ms": 1e3 * min(times), "pipelined_ms": 1e3 * pipelined,
         "first_step_s": first, "tokens_per_s": tokens / med, "tflops": flops / med / 1e12,
         "fraction_of_matmul_peak": flops / med / 1e12 / peak, "loss": float(loss),
         "pool_mb": pool.total_bytes() / 2**20, "times_ms": [1e3 * t for t in times]}
    # greedy decoding, 64 tokens: key/value cache against re-running the prefix (same tokens asserted)
    model.tgt_embed.weight.data[EOS] = 0.0                # an untrained model must not stop early
    dsrc = make_batch(V, B_decode, S, T, seed=1)[0]
    dec = {}
    for mode in ("cached", "naive", "cached", "naive"):   # the first of each compiles, the second is timed
        t0 = time.perf_counter()
        ids = mt.decoding.greedy_decode(model, dsrc, max_len=DECODE_LEN, naive=(mode == "naive"))
        dec[mode] = (time.perf_counter() - t0, ids)
    assert dec["cached"][1] == dec["naive"][1], "cached and naive greedy decoding emitted different tokens"
    n_tokens = sum(len(h) for h in dec["cached"][1])
    r["decode"] = {"batch": B_decode, "tokens": n_tokens, "cached_s": dec["cached"][0], "naive_s": dec["naive"][0],
                   "speedup": dec["naive"][0] / dec["cached"][0], "same_tokens": True}
    results[preset] = r
    print(f"{preset:5s} step {r['median_ms']:7.2f} ms (pipelined {r['pipelined_ms']:7.2f}, first {first:5.1f} s)  "
          f"{r['tokens_per_s']:10,.0f} tok/s  {r['tflops']:6.2f} TFLOP/s ({100 * r['fraction_of_matmul_peak']:.1f}% "
          f"of peak)  pool {r['pool_mb']:8.1f} MB  greedy {n_tokens} tokens: cached {dec['cached'][0]:.2f} s, "
          f"naive {dec['naive'][0]:.2f} s ({r['decode']['speedup']:.1f}x)", flush=True)
    del model, opt, loss_fn

date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
lines = [f"Measured {date} on {gpu} with CuPy {cupy.__version__}, NumPy {numpy.__version__}; float32 cuBLAS "
         f"matmul peak {peak:.1f} TFLOP/s. Step = forward + label-smoothed loss + backward + Adam, synchronised.",
         "", "| preset | batch (B, S, T, V) | step ms | pipelined ms | tokens/s | TFLOP/s (% peak) | CuPy pool MB | "
         "greedy 64 tok: cached vs naive |", "|---|---|---|---|---|---|---|---|"]
for preset, r in results.items():
    s, d = r["shape"], r["decode"]
    lines.append(f"| {preset} | {s['batch']}, {s['src_len']}, {s['tgt_len']}, {s['vocab']} | {r['median_ms']:.2f} | "
                 f"{r['pipelined_ms']:.2f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.2f} "
                 f"({100 * r['fraction_of_matmul_peak']:.1f}%) | {r['pool_mb']:.0f} | {d['speedup']:.1f}x "
                 f"({d['cached_s']:.2f} s vs {d['naive_s']:.2f} s) |")
cpu_base_ms = os.environ.get("CPU_BASE_MS")
report = {"date": date, "gpu": gpu, "cupy": cupy.__version__, "numpy": numpy.__version__, "peak_tflops": peak,
          "steps": steps, "presets": results}
if cpu_base_ms and "base" in results:
    speedup = float(cpu_base_ms) / results["base"]["median_ms"]
    report["base_speedup_vs_cpu"] = {"cpu_ms": float(cpu_base_ms), "speedup": speedup, "target": 30.0}
    lines += ["", f"base step: {float(cpu_base_ms):.0f} ms on 2 CPU cores, {results['base']['median_ms']:.1f} ms "
              f"here: {speedup:.1f}x (issue 6's target >= 30x: {'met' if speedup >= 30 else 'not met'})"]
table = "\n".join(lines) + "\n"
print("\n" + table)
with open(os.path.join(out_dir, "bench_gpu.json"), "w") as f:
    json.dump(report, f, indent=1)
with open(os.path.join(out_dir, "bench_gpu.md"), "w") as f:
    f.write(table)
PY
fi

stage "done"
echo "results in $OUT_DIR; exit status $status"
return "$status"
}

main 2>&1 | tee "$OUT_DIR/gpu.log"             # everything also lands in $OUT_DIR/gpu.log
exit "${PIPESTATUS[0]}"
