// Device-only helpers shared by the .cu files (nvcc, or g++ with the emulation of tests/cuda_emu).
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common.cuh"

// A kernel launch: MARIN_LAUNCH(grid, block, stream, kernel)(args...). One macro, so that the host build of
// tests/cuda_emu (which defines its own) runs the same launch lines.
#ifndef MARIN_LAUNCH
#define MARIN_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

namespace marin {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Butterfly reductions: every lane ends with the same, bitwise identical, value.
__device__ __forceinline__ float warp_sum(float v) {
  MARIN_UNROLL
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {  // NaN if any lane holds NaN
  MARIN_UNROLL
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = max_or_nan(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// A plain type of N bytes (16: uint4), for copies and zero fills that need no element type.
template <int N> struct RawBytes;
template <> struct RawBytes<16> { using type = uint4; };
template <> struct RawBytes<8> { using type = uint2; };
template <> struct RawBytes<4> { using type = uint32_t; };
template <> struct RawBytes<2> { using type = uint16_t; };
template <> struct RawBytes<1> { using type = uint8_t; };

// VEC elements moved as one access of sizeof(T)*VEC bytes (16 for the fast path).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_floats(const T* __restrict__ src, float (&out)[VEC]) {
  const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(src);
  MARIN_UNROLL
  for (int i = 0; i < VEC; ++i) out[i] = to_float(pack.v[i]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_floats(T* __restrict__ dst, const float (&in)[VEC]) {
  Pack<T, VEC> pack;
  MARIN_UNROLL
  for (int i = 0; i < VEC; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, VEC>*>(dst) = pack;
}

// A row operand of a row kernel: its base address and element size.
struct RowOperand {
  const void* ptr;
  size_t elem_size;
};

// Elements per access of a row kernel: the largest of max_vec, max_vec/2, ..., 1 for which every operand's
// rows and base address allow accesses of vec * elem_size bytes (16, 8, 4 or 2).
template <int N>
int row_vector(int max_vec, int64_t hidden, const RowOperand (&operands)[N]) {
  for (int vec = max_vec; vec > 1; vec /= 2) {
    bool ok = true;
    for (const RowOperand& o : operands) {
      const int64_t size = static_cast<int64_t>(o.elem_size), bytes = vec * size;
      ok = ok && (hidden * size) % bytes == 0 && reinterpret_cast<uintptr_t>(o.ptr) % bytes == 0;
    }
    if (ok) return vec;
  }
  return 1;
}

// Calls fn(std::integral_constant<int, V>{}) with V the largest power of two <= min(vec, MaxVec).
template <int MaxVec, typename Fn>
void with_vector(int vec, Fn fn) {
  if constexpr (MaxVec > 1) {
    if (vec >= MaxVec) {
      fn(std::integral_constant<int, MaxVec>{});
      return;
    }
    with_vector<MaxVec / 2>(vec, fn);
  } else {
    fn(std::integral_constant<int, 1>{});
  }
}

// Row kernels (permute's copy, unpermute and its backward) run one block of kRowThreads per token, plus
// blocks that zero the padding rows of their output, kRowThreads rows each (one warp per 32 rows).
constexpr int kRowThreads = 128;

// Zeroes the rows first_row + [0, kRowThreads) of out (row r at out + r*row_vecs) for which is_padding(r)
// holds; is_padding is called once per row by the thread that owns it.
template <typename V, typename Pred>
__device__ __forceinline__ void zero_padding_rows(V* __restrict__ out, int64_t row_vecs, int64_t rows,
                                                  int64_t first_row, Pred is_padding) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp_first = first_row + (threadIdx.x / kWarpSize) * kWarpSize;
  const int64_t row = warp_first + lane;
  unsigned pending = __ballot_sync(kFullMask, row < rows && is_padding(row));
  while (pending) {
    const int bit = __ffs(pending) - 1;
    pending &= pending - 1;
    V* dst = out + (warp_first + bit) * row_vecs;
    for (int64_t i = lane; i < row_vecs; i += kWarpSize) dst[i] = V{};
  }
}

// Calls fn(TypeTag<T>{}) with T the element type of a marin::DType code; cudaErrorInvalidValue for others.
template <typename T> struct TypeTag { using type = T; };

template <typename Fn>
cudaError_t with_dtype(int dtype, Fn fn) {
  switch (dtype) {
    case kFloat32: return fn(TypeTag<float>{});
    case kBFloat16: return fn(TypeTag<__nv_bfloat16>{});
    case kFloat16: return fn(TypeTag<__half>{});
    default: return cudaErrorInvalidValue;
  }
}

// A kernel's occupancy on this GPU (marin_kernel_occupancy): resident blocks of `threads` per multiprocessor,
// -1 when the runtime cannot tell (no GPU).
struct Occupancy {
  const char* name;
  int threads;
  int blocks;
};

template <typename Kernel>
Occupancy occupancy_of(const char* name, Kernel kernel, int threads) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess) blocks = -1;
  return Occupancy{name, threads, blocks};
}

// Each .cu lists its kernels' occupancy (the instantiations the benchmark's shapes use); api.cu joins them.
int route_topk_occupancy(Occupancy* out);
int permute_occupancy(Occupancy* out);
int unpermute_occupancy(Occupancy* out);
constexpr int kMaxOccupancyEntries = 8;  // per .cu

// Device properties a launcher sizes its grid from, cached per device.
inline int multiprocessor_count() {
  static int cached[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
      count = 132;
    cached[device] = count;
  }
  return cached[device];
}

}  // namespace marin
