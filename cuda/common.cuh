// Shared definitions of the marin CUDA kernels.
//
// Per-element logic lives in MARIN_HD functions (__host__ __device__ under nvcc, plain inline functions under
// g++). The whole of cuda/ also compiles with g++ against the CUDA emulation of tests/cuda_emu, which runs
// the kernels themselves on the CPU (tests/test_cuda_emulated.py). No torch headers anywhere: docs/cuda.md.
#pragma once

#include <stdint.h>
#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#define MARIN_HD __host__ __device__ __forceinline__
#define MARIN_UNROLL _Pragma("unroll")
#else
#define MARIN_HD inline
#define MARIN_UNROLL
#endif

namespace marin {

// Element types understood by the launchers (the Python side passes these codes).
enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr int kWarpSize = 32;
constexpr int kMaxExperts = 512;  // route_topk keeps a token's scores in registers: 16 per lane
constexpr int kMaxTopK = 16;      // k of route_topk, K of permute / unpermute

// The src_of of a routed row that no entry fills (permute's contract): padding inside a group, whose data is
// zero, or an unused row past the last group (offsets[E]), whose data is never written and never read.
constexpr int kPaddingRow = -1;
constexpr int kUnusedRow = -2;

MARIN_HD int popcount32(uint32_t mask) {
#ifdef __CUDA_ARCH__
  return __popc(mask);
#else
  return __builtin_popcount(mask);
#endif
}

MARIN_HD bool is_nan(float v) { return v != v; }

MARIN_HD uint32_t float_bits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
#endif
}

// max that propagates NaN (fmaxf ignores it), as torch's max and logsumexp do.
MARIN_HD float max_or_nan(float a, float b) { return (a > b || is_nan(a)) ? a : b; }

}  // namespace marin
