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
# 3. the float32 training step on CuPy for tiny, small and base at issue 6's batch shapes, timed by
#    benchmarks/bench_step.py --backend cupy (the CPU benchmark's own code: same batches, FLOP count and
#    decoding check; `--backend fakecupy` runs that path on a machine without a GPU, and the tests do).
#    Table on stdout, JSON and Markdown in $OUT (or benchmarks/gpu-results/ where OUT is unset).
#
# Settings (environment): PYTHON (python3), PRESETS (tiny,small,base), STEPS (timed steps per run, 20),
# BENCH_ARGS (extra bench_step.py arguments), CPU_BASE_MS (the base step on 2 CPU cores, default the
# README's faster CPU run, C: gives the GPU speed-up against issue 6's 30x target). Every stage runs even if an
# earlier one failed; the exit status is 0 only if all passed. Expect about 3-5 minutes on an H200, much of
# it CuPy compiling its kernels on a fresh machine; each stage has its own time limit (150 + 150 + 240 s),
# so that the whole stays inside one 600 s device call and a stuck stage still leaves the others' results
# in $OUT.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
PRESETS=${PRESETS:-tiny,small,base}
STEPS=${STEPS:-20}
CPU_BASE_MS=${CPU_BASE_MS:-2485}                 # README run C, base, 2 threads: the faster CPU, the stricter 30x
OUT_DIR=${OUT:-benchmarks/gpu-results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
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
    tests/test_optim.py::test_adam_on_a_device_equals_numpy \
    || { echo "FAILED: CuPy against NumPy"; status=1; }

stage "training step on CuPy"
# The CPU benchmark itself on the cupy backend: the same batches, FLOP count and decoding check; each step
# ends with a device synchronize. --cpu-base-ms adds issue 6's 30x target.
read -r -a bench_args <<< "${BENCH_ARGS:-}"
timeout 240 "$PYTHON" benchmarks/bench_step.py --backend cupy --presets "$PRESETS" --steps "$STEPS" \
    --repeats 5 --cpu-base-ms "$CPU_BASE_MS" ${bench_args[@]+"${bench_args[@]}"} \
    --json "$OUT_DIR/bench_step_cupy.json" --markdown "$OUT_DIR/bench_step_cupy.md" \
    || { echo "FAILED: bench_step.py --backend cupy"; status=1; }

stage "done"
echo "results in $OUT_DIR; exit status $status"
return "$status"
}

main 2>&1 | tee "$OUT_DIR/gpu.log"             # everything also lands in $OUT_DIR/gpu.log
exit "${PIPESTATUS[0]}"
