#!/usr/bin/env bash
# The CuPy backend on a GPU, in one prepared run: prove both tiers correct there, then time them.
#
#   bash benchmarks/gpu.sh                      # on a machine with an NVIDIA GPU and CuPy
#
# 1. environment: GPU, driver, Python, NumPy, CuPy (installs cupy-cuda13x when no CuPy build is there: from
#    PyPI, or offline from wheels in .whl/);
# 2. the gradient checks of every layer on the cupy backend (MINITRANSFORMER_BACKEND=cupy; conftest keeps
#    the session's backend; `minitransformer gradcheck`'s table), and the fast tier against the core there;
# 3. from NumPy, the device-boundary tests (training step, evaluation, decoding, gradcheck and Trainer on CuPy
#    against NumPy) and the loss/optimiser CuPy tests;
# 4. the float32 training step on CuPy for each preset, both tiers, timed by benchmarks/bench_step.py
#    --backend cupy (the CPU benchmark's own code: same batches, FLOP count and decoding check;
#    `--backend fakecupy` runs that path on a machine without a GPU, and the tests do).
#    Table on stdout, JSON and Markdown in $OUT (or benchmarks/gpu-results/ where OUT is unset).
#
# Settings (environment): PYTHON (python3), PRESETS (tiny,small,base), STEPS (timed steps per run, 20),
# BENCH_ARGS (extra bench_step.py arguments, e.g. --cpu-base-ms N to print the speed-up over a CPU step),
# STAGE_LIMITS (seconds for the gradient checks, the CuPy-against-NumPy tests and the benchmark: 150,150,240).
# Every stage runs even if an earlier one failed; the exit status is 0 only if all passed. Each stage has its
# own time limit, so that the whole stays inside one 600 s call and a stuck stage leaves the others' results.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
PRESETS=${PRESETS:-tiny,small,base}
STEPS=${STEPS:-20}
IFS=, read -r -a LIMITS <<< "${STAGE_LIMITS:-150,150,240}"   # seconds for the three test/benchmark stages
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
    echo "no CuPy here: installing cupy-cuda13x"
    if ! "$PYTHON" -m pip install -q cupy-cuda13x; then
        if [ -d .whl ] && "$PYTHON" -m pip install -q --no-index --find-links .whl cupy-cuda13x; then
            echo "installed from the carried wheels in .whl/"
        else
            echo "FAILED: pip could not install cupy-cuda13x (no network there?). Carry its wheel in .whl/,"
            echo "or install the CuPy build matching the CUDA driver (cupy-cuda12x for CUDA 12 drivers)."
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
MINITRANSFORMER_BACKEND=cupy timeout "${LIMITS[0]}" "$PYTHON" -m pytest -q -p no:cacheprovider -rs \
    tests/test_layers_gradcheck.py tests/test_fast.py \
    || { echo "FAILED: gradient checks on the cupy backend"; status=1; }
MINITRANSFORMER_BACKEND=cupy timeout "${LIMITS[0]}" "$PYTHON" -m minitransformer gradcheck \
    || { echo "FAILED: minitransformer gradcheck on the cupy backend"; status=1; }

stage "CuPy against NumPy"
# These start on NumPy (their reference) and switch to CuPy themselves: no MINITRANSFORMER_BACKEND here.
timeout "${LIMITS[1]}" "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_device_boundary.py \
    tests/test_loss.py::test_cupy_matches_numpy tests/test_optim.py::test_cupy_adam_and_clip_match_numpy \
    tests/test_optim.py::test_adam_on_a_device_equals_numpy \
    || { echo "FAILED: CuPy against NumPy"; status=1; }

stage "training step on CuPy"
# The CPU benchmark itself on the cupy backend: the same batches, FLOP count and decoding check; each step
# ends with a device synchronize.
read -r -a bench_args <<< "${BENCH_ARGS:-}"
timeout "${LIMITS[2]}" "$PYTHON" benchmarks/bench_step.py --backend cupy --presets "$PRESETS" --steps "$STEPS" \
    --repeats 5 ${bench_args[@]+"${bench_args[@]}"} \
    --json "$OUT_DIR/bench_step_cupy.json" --markdown "$OUT_DIR/bench_step_cupy.md" \
    || { echo "FAILED: bench_step.py --backend cupy"; status=1; }

stage "done"
echo "results in $OUT_DIR; exit status $status"
return "$status"
}

main 2>&1 | tee "$OUT_DIR/gpu.log"             # everything also lands in $OUT_DIR/gpu.log
exit "${PIPESTATUS[0]}"
