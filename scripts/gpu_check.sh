#!/usr/bin/env bash
# The GPU check of the kernels, in one command, for a machine with an NVIDIA GPU, nvcc, python3 with torch and
# pytest, and none of our other dependencies (the H200 machine: Python 3.12, torch 2.11, nvcc 13.0):
#
#   bash scripts/gpu_check.sh            # logs and tables under $OUT if set, else out/gpu_check/
#   bash scripts/gpu_check.sh --cpu      # dry run without a GPU: every step, the benchmark on the CPU
#
# Steps, each time-boxed so the whole run stays under 8 minutes (the device tool's calls stop at 10):
#   1. build cuda/ (python -m marin_model.cuda --build) and keep the ptxas report; then the driver and
#      runtime versions and each kernel's occupancy (blocks per SM) into summary.txt
#   2. the GPU tests (tests/test_cuda_ops.py; tests/test_train_cuda.py: bf16 training on the kernels) and
#      the build tests, with MARIN_CUDA_KERNELS=require so a kernel that fails to load fails the run
#      instead of falling back to the reference
#   3. the benchmark (benchmarks/bench_kernels_gpu.py: T = 4096, 16384, 65536, the Marin 535B shape first,
#      one align = 128 row, CUDA-graph replay of each op), Markdown table in bench_kernels.md
#   4. compute-sanitizer memcheck and racecheck over a few small tests (works on Firecracker machines)
# summary.txt starts with the environment and lists each step's status and time; 8 files at most (all the
# device tool brings back). Exit status: non-zero if the build or the tests fail.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-out/gpu_check}
PY=${PYTHON:-python3}
DRY_RUN=0
if [ "${1:-}" = "--cpu" ]; then DRY_RUN=1; fi
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR/summary.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY_RUN" = 0 ]; then export MARIN_CUDA_KERNELS=require; fi
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
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  nvcc --version || true
  "$PY" -c "import triton; print('triton', triton.__version__)" || true
} > "$OUT_DIR/summary.txt" 2>&1
cat "$OUT_DIR/summary.txt"

step build 150 "$PY" -m marin_model.cuda --build || STATUS=1
{ echo "== ptxas report"; cat cuda/build/libmarin_kernels-*.log; } >> "$OUT_DIR/build.log" 2>&1

# The driver the library's static runtime needs, and how many blocks of each kernel fit on one SM.
step occupancy 60 "$PY" - <<'PYEOF' || STATUS=1
from marin_model.cuda import build, dispatch, library
from marin_model import ops  # noqa: F401 - registers the kernels
lib = library.open_library(build.build_library().library)
runtime, driver = library.cuda_versions(lib)
print(f"library runtime {runtime}, driver {driver}, driver ok: {library.driver_supports(runtime, driver)}")
dispatch.register_cuda_kernels()  # raises under MARIN_CUDA_KERNELS=require if the kernels cannot serve
print("dispatch:", dispatch.status())
for name, threads, blocks in library.kernel_occupancy(lib):
    print(f"occupancy {name}: {threads} threads/block, {blocks} blocks/SM")
PYEOF
grep -E "^(library runtime|dispatch|occupancy)" "$OUT_DIR/occupancy.log" >> "$OUT_DIR/summary.txt"
cat "$OUT_DIR/occupancy.log" >> "$OUT_DIR/build.log" && rm -f "$OUT_DIR/occupancy.log"  # 8 files at most in $OUT

# --noconftest: tests/conftest.py serves the data tests and imports pyarrow-based modules
PYTEST=("$PY" -m pytest --noconftest -p no:cacheprovider -q -rs)
if "$PY" -c "import xdist" 2>/dev/null; then PYTEST+=(-n 4); fi
step tests 180 "${PYTEST[@]}" --junitxml="$OUT_DIR/junit.xml" tests/test_cuda_ops.py tests/test_cuda_build.py tests/test_train_cuda.py \
  || STATUS=1

if [ "$DRY_RUN" = 1 ]; then
  BENCH=(--device cpu --tokens 128 256 --align 128)
else
  BENCH=(--tokens 4096 16384 65536 --align 128)
fi
step bench 150 "$PY" benchmarks/bench_kernels_gpu.py "${BENCH[@]}" --budget-s 110 --out "$OUT_DIR/bench_kernels.md"

SANITIZER=$(command -v compute-sanitizer || echo "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer")
if [ -x "$SANITIZER" ] && [ "$DRY_RUN" = 0 ]; then
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
