#!/usr/bin/env bash
# The GPU check of issue 7, in one command, for a machine with an NVIDIA GPU, nvcc, python3 with torch and
# pytest, and none of our other dependencies (the H200 machine: Python 3.12, torch 2.11, nvcc 13.0):
#
#   bash scripts/gpu_check.sh            # logs and tables under $OUT if set, else out/gpu_check/
#
# Steps, each time-boxed so the whole run stays under 8 minutes (the device tool's calls stop at 10):
#   1. build cuda/ (python -m marin_model.cuda --build) and keep the ptxas report
#   2. the GPU tests (tests/test_cuda_ops.py; tests/test_train_cuda.py: bf16 training on the kernels) and
#      the build tests, with MARIN_CUDA_KERNELS=require so a kernel that fails to load fails the run
#      instead of falling back to the reference
#   3. the benchmark (benchmarks/bench_kernels_gpu.py), Markdown table in bench_kernels.md
#   4. compute-sanitizer memcheck and racecheck over a few small tests (works on Firecracker machines)
# summary.txt starts with the environment and lists each step's status and time; 8 files at most (all the
# device tool brings back). Exit status: non-zero if the build or the tests fail.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-out/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MARIN_CUDA_KERNELS=require
START=$SECONDS
STATUS=0

# step NAME LIMIT_S COMMAND...: runs COMMAND with a time limit, logs to NAME.log, notes the result.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT_DIR/$name.log"
  local verdict=pass
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict=timeout; elif [ "$rc" -ne 0 ]; then verdict="fail (rc=$rc)"; fi
  echo "$name: $verdict in $((SECONDS - t0))s" | tee -a "$OUT_DIR/summary.txt"
  return "$rc"
}

{
  nvidia-smi || true
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  nvcc --version || true
  "$PY" -c "import triton; print('triton', triton.__version__)" || true
} > "$OUT_DIR/summary.txt" 2>&1
cat "$OUT_DIR/summary.txt"

step build 120 "$PY" -m marin_model.cuda --build || STATUS=1
{ echo "== ptxas report"; cat cuda/build/libmarin_kernels-*.log; } >> "$OUT_DIR/build.log" 2>&1

# --noconftest: tests/conftest.py serves the data tests and imports pyarrow-based modules
PYTEST=("$PY" -m pytest --noconftest -p no:cacheprovider -q -rs)
if "$PY" -c "import xdist" 2>/dev/null; then PYTEST+=(-n 4); fi
step tests 180 "${PYTEST[@]}" --junitxml="$OUT_DIR/junit.xml" tests/test_cuda_ops.py tests/test_cuda_build.py tests/test_train_cuda.py \
  || STATUS=1

step bench 150 "$PY" benchmarks/bench_kernels_gpu.py --tokens 4096 16384 128 --budget-s 110 --out "$OUT_DIR/bench_kernels.md"

SANITIZER=$(command -v compute-sanitizer || echo "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer")
if [ -x "$SANITIZER" ]; then
  SMALL='tiny_batches or misaligned or one_expert or serve or (equals_the_reference and 512-8-16-4 and sigmoid) or (route_topk_backward and True-sigmoid-dtype0) or (unpermute and 300-2-7-33)'
  LEFT=$((470 - (SECONDS - START)))
  for tool in memcheck racecheck; do
    if [ "$LEFT" -lt 40 ]; then echo "sanitize_$tool: skipped (time)" | tee -a "$OUT_DIR/summary.txt"; continue; fi
    step "sanitize_$tool" $((LEFT / 2)) "$SANITIZER" --tool "$tool" --error-exitcode 3 \
      "$PY" -m pytest --noconftest -p no:cacheprovider -q tests/test_cuda_ops.py -k "$SMALL"
    LEFT=$((470 - (SECONDS - START)))
  done
else
  echo "sanitize: skipped (no compute-sanitizer)" | tee -a "$OUT_DIR/summary.txt"
fi

echo "total: $((SECONDS - START))s, status $STATUS" | tee -a "$OUT_DIR/summary.txt"
exit "$STATUS"
