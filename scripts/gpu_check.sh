#!/usr/bin/env bash
# The GPU check of the kernels, in one command, for a machine with an NVIDIA GPU, nvcc, python3 with torch and
# pytest, and none of our other dependencies (the H200 machine: Python 3.12, torch 2.11, nvcc 13.0):
#
#   bash scripts/gpu_check.sh            # results under $OUT if set, else out/gpu_check/
#   bash scripts/gpu_check.sh --cpu      # dry run without a GPU: every step, the benchmark on the CPU
#   PYTHON=.venv/bin/python bash scripts/gpu_check.sh --cpu
#
# Steps, in order of value, each under its own limit; the limits add up to at most 480 s (the device tool's
# calls stop at 600 s), and the sanitizers get whatever the earlier steps left of it:
#   env        20 s  nvidia-smi, Python, torch, nvcc, triton and compute-sanitizer versions -> summary.txt
#   build     120 s  python -m marin_model.cuda --build and its ptxas report -> build.log (--cpu: 240 s)
#   occupancy  30 s  the library's runtime and the driver, dispatch status, blocks per SM of each kernel
#                    -> summary.txt (and build.log)
#   tests     150 s  tests/test_cuda_ops.py, tests/test_cuda_build.py (it finds the build above cached:
#                    MARIN_CUDA_BUILD_DIR), tests/test_train_cuda.py, 100 s per test, with
#                    MARIN_CUDA_KERNELS=require (a kernel that fails to load fails the run instead of falling
#                    back to the reference) -> junit.xml, tests.log
#   bench      80 s  benchmarks/bench_kernels_gpu.py (T = 4096, 16384, 65536, the Marin 535B shape first, one
#                    align = 128 row; it starts no row after 55 s) -> bench_kernels.md (rewritten after each
#                    row), bench.log
#   sanitize   rest  a probe (a tiny CUDA program under compute-sanitizer: a sandbox that refuses the device is
#                    reported and the sanitizers skipped), then memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so
#                    an overrun inside what would be one of torch's cached segments is seen) and racecheck over
#                    a few small tests -> sanitize.log. With --cpu, the host builds of the kernels in their
#                    place: ASan and UBSan for memcheck, ThreadSanitizer for racecheck
#                    (tests/test_cuda_emulated.py's sanitizer tests, the two at once).
# Each file is written as its step runs, so a run cut short still leaves what finished. summary.txt is the
# file to read first: the environment, then one line per step (verdict, time, limit). 7 files in all (the
# device tool brings back 8). Exit status: non-zero if the build, the occupancy check or the tests fail; a
# failed build ends the run (every later step would build the library again).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-out/gpu_check}
PY=${PYTHON:-python3}
DRY_RUN=0
if [ "${1:-}" = "--cpu" ]; then DRY_RUN=1; fi
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
rm -f "$SUMMARY" "$OUT_DIR"/{build.log,tests.log,junit.xml,bench.log,bench_kernels.md,sanitize.log}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MARIN_CUDA_BUILD_DIR=${MARIN_CUDA_BUILD_DIR:-$PWD/cuda/build}  # one build for every step
if [ "$DRY_RUN" = 0 ]; then export MARIN_CUDA_KERNELS=require; fi
BUDGET=480
START=$SECONDS
STATUS=0

# step NAME LOG CAP COMMAND...: COMMAND for at most CAP seconds (less if the budget has less left), its output
# appended to LOG; one line in summary.txt.
step() {
  local name=$1 log=$OUT_DIR/$2 cap=$3 t0=$SECONDS rc verdict limit
  shift 3
  limit=$((BUDGET - (SECONDS - START)))
  if [ "$cap" -lt "$limit" ]; then limit=$cap; fi
  if [ "$limit" -lt 15 ]; then
    echo "$name: skipped (${limit}s of the ${BUDGET}s budget left)" | tee -a "$SUMMARY"
    return 124
  fi
  echo "== $name (limit ${limit}s)" | tee -a "$log"
  timeout --kill-after=5 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  tail -n 25 "$log"
  verdict=pass
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict=timeout; elif [ "$rc" -ne 0 ]; then verdict="fail (rc=$rc)"; fi
  echo "$name: $verdict in $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$SUMMARY"
  return "$rc"
}

# The nvcc the build takes (the PATH, $CUDA_HOME, /usr/local/cuda*, ...), and the compute-sanitizer beside it.
NVCC=$(timeout 60 "$PY" -c "from marin_model.cuda.build import find_nvcc; print(find_nvcc() or 'nvcc')" 2>/dev/null || echo nvcc)
SANITIZER=$(command -v compute-sanitizer || echo "$(dirname "$(command -v "$NVCC" || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer")
export PY NVCC SANITIZER
ENVIRONMENT='
nvidia-smi || true
"$PY" -c "import sys, torch
print(sys.version)
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, f\"sm_{p.major}{p.minor},\", p.multi_processor_count, \"SMs,\", p.total_memory >> 30, \"GiB\")
else:
    print(\"no GPU\")"
"$NVCC" --version || true
"$PY" -c "import triton; print(\"triton\", triton.__version__)" || true
if [ -x "$SANITIZER" ]; then "$SANITIZER" --version | tail -n 2; else echo "no compute-sanitizer"; fi
'
step env summary.txt 20 bash -c "$ENVIRONMENT"
if [ "$DRY_RUN" = 1 ]; then echo "dry run (--cpu): no GPU steps, the benchmark on the CPU" >> "$SUMMARY"; fi

finish() {
  echo "total: $((SECONDS - START))s of ${BUDGET}s, status $STATUS" | tee -a "$SUMMARY"
  exit "$STATUS"
}

# The dry run's machine may be two shared cores, where the four files take minutes to compile, not 30 s.
BUILD_LIMIT=$([ "$DRY_RUN" = 1 ] && echo 240 || echo 120)
if ! step build build.log "$BUILD_LIMIT" "$PY" -m marin_model.cuda --build; then
  # Every later step would build the library again, each within its own limit: stop here instead.
  STATUS=1
  echo "not run: occupancy, tests, bench, sanitize (they need the library; build.log says why)" | tee -a "$SUMMARY"
  finish
fi
{ echo "== ptxas report"; cat "$MARIN_CUDA_BUILD_DIR"/libmarin_kernels-*.log; } >> "$OUT_DIR/build.log" 2>&1

# The driver the library's static runtime needs, and how many blocks of each kernel fit on one SM.
OCCUPANCY='
from marin_model.cuda import build, dispatch, library
from marin_model import ops  # noqa: F401 - registers the kernels
lib = library.open_library(build.build_library().library)
runtime, driver = library.cuda_versions(lib)
print(f"library runtime {runtime}, driver {driver}, driver ok: {library.driver_supports(runtime, driver)}")
dispatch.register_cuda_kernels()  # raises under MARIN_CUDA_KERNELS=require if the kernels cannot serve
print("dispatch:", dispatch.status())
for name, threads, blocks in library.kernel_occupancy(lib):
    print(f"occupancy {name}: {threads} threads/block, {blocks} blocks/SM")
'
step occupancy build.log 30 "$PY" -c "$OCCUPANCY" || STATUS=1
sed -n '/^== occupancy/,$p' "$OUT_DIR/build.log" | grep -E "^(library runtime|dispatch|occupancy)" >> "$SUMMARY"

# --noconftest: tests/conftest.py serves the data tests and imports modules this machine lacks.
# OMP_NUM_THREADS: the workers' CPU references would otherwise each start a thread per core.
PYTEST=("$PY" -m pytest --noconftest -p no:cacheprovider -q -rfEs --durations=15)
# A test past 100 s is stopped, so one hang (in NCCL, say) does not take the step's junit.xml with it: under
# xdist by ending its worker (the thread method also stops a hang inside C code), which xdist replaces.
if "$PY" -c "import pytest_timeout" 2>/dev/null; then PYTEST+=(--timeout=100); fi
if "$PY" -c "import xdist" 2>/dev/null; then
  PYTEST+=(-n "$([ "$DRY_RUN" = 1 ] && echo 2 || echo 4)")
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then PYTEST+=(--timeout-method=thread); fi
fi
step tests tests.log 150 env OMP_NUM_THREADS=4 "${PYTEST[@]}" --junitxml="$OUT_DIR/junit.xml" \
  tests/test_cuda_ops.py tests/test_cuda_build.py tests/test_train_cuda.py || STATUS=1

if [ "$DRY_RUN" = 1 ]; then
  BENCH=(--device cpu --tokens 128 --align 16)  # the CPU reference at align 128 takes seconds a call
else
  BENCH=(--tokens 4096 16384 65536 --align 128)
fi
step bench bench.log 80 "$PY" benchmarks/bench_kernels_gpu.py "${BENCH[@]}" --budget-s 55 \
  --out "$OUT_DIR/bench_kernels.md"

# The sanitizers get the rest of the budget: memcheck 60% of it, racecheck what memcheck leaves.
SMALL='tiny_batches or misaligned or one_expert or serve or (equals_the_reference and 512-8-16-4 and sigmoid) or (route_topk_backward and True-sigmoid-dtype0) or (unpermute and 300-2-7-33)'
# --report-api-errors no: torch's own probing calls return errors, which are not the kernels' memory errors;
# --launch-timeout 0: the default gives the target 10 s to connect, which pytest importing torch can miss (and
# then hang: https://github.com/proteneer/timemachine/pull/668); the step's limit bounds the wait instead.
SANITIZE=("$SANITIZER" --error-exitcode 3 --report-api-errors no --launch-timeout 0)
SANITIZED_TESTS=("$PY" -m pytest --noconftest -p no:cacheprovider -p no:xdist -q -rfEs tests/test_cuda_ops.py -k "$SMALL")
if [ "$DRY_RUN" = 1 ]; then
  HOST_SANITIZERS=("$PY" -m pytest --noconftest -p no:cacheprovider -q -rfEs tests/test_cuda_emulated.py -k sanitizer)
  if "$PY" -c "import xdist" 2>/dev/null; then HOST_SANITIZERS+=(-n 2); fi
  step sanitize_host sanitize.log $((BUDGET - (SECONDS - START))) "${HOST_SANITIZERS[@]}"
elif [ ! -x "$SANITIZER" ]; then
  echo "sanitize: skipped (no compute-sanitizer next to nvcc or on the PATH)" | tee -a "$SUMMARY"
else
  # A sandbox (gVisor) refuses the device to the sanitizer ("Device not supported", then error 999 at the
  # first allocation): find out on a tiny program before spending the budget on torch under it.
  PROBE_DIR=$(mktemp -d)
  cat > "$PROBE_DIR/probe.cu" <<'CUEOF'
#include <cstdio>
__global__ void fill(int *p) { p[threadIdx.x] = threadIdx.x; }
int main() {
  int *d = nullptr, h[32] = {0};
  cudaError_t e = cudaMalloc(&d, sizeof(h));
  if (e == cudaSuccess) { fill<<<1, 32>>>(d); e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost); }
  if (e == cudaSuccess && h[31] != 31) e = cudaErrorUnknown;
  std::printf("probe: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
CUEOF
  export PROBE_DIR
  if step sanitize_probe sanitize.log 30 bash -c '"$NVCC" -o "$PROBE_DIR/probe" "$PROBE_DIR/probe.cu" &&
      "$SANITIZER" --tool memcheck --error-exitcode 3 "$PROBE_DIR/probe"'; then
    step sanitize_memcheck sanitize.log $(((BUDGET - (SECONDS - START)) * 6 / 10)) \
      env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${SANITIZE[@]}" --tool memcheck "${SANITIZED_TESTS[@]}"
    step sanitize_racecheck sanitize.log $((BUDGET - (SECONDS - START))) \
      "${SANITIZE[@]}" --tool racecheck "${SANITIZED_TESTS[@]}"
  else
    why=$(grep -m1 -i "not supported" "$OUT_DIR/sanitize.log" || grep -m1 "^probe:" "$OUT_DIR/sanitize.log")
    echo "sanitize: skipped (compute-sanitizer cannot run the probe here: ${why:-see sanitize.log})" | tee -a "$SUMMARY"
  fi
  rm -rf "$PROBE_DIR"
fi

finish
