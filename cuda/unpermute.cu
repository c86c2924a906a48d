// unpermute (pull-based weighted combine) and its backward (push of the weighted gradient to each routed row,
// fused with the combine-weight gradient). One block per token, fp32 math, fixed summation orders, so every
// run gives the same bits. Products and sums are rounded separately (__fmul_rn, __fadd_rn: no FMA
// contraction), in the order of the CPU reference, so the forward output equals the reference bitwise.
#include "device.cuh"
#include "marin_kernels.h"

namespace marin {
namespace {

constexpr int kRowWarps = kRowThreads / kWarpSize;
constexpr int kPullBatch = 4;      // routed rows a thread of unpermute loads before summing
constexpr int kRowMinBlocks = 8;   // blocks per multiprocessor the row kernels are compiled for (<= 64 regs)

// Token t's kept rows and weights, staged in shared memory by the first top_k threads. A row outside
// [0, total_rows) counts as dropped: row_of is not checked on the host (that would cost a synchronisation).
__device__ __forceinline__ void stage_token(const int* __restrict__ row_of, const float* __restrict__ weights,
                                            int64_t t, int top_k, int64_t total_rows, int* rows, float* w) {
  if (threadIdx.x < top_k) {
    const int row = row_of[t * top_k + threadIdx.x];
    rows[threadIdx.x] = row >= 0 && row < total_rows ? row : -1;
    w[threadIdx.x] = weights != nullptr ? weights[t * top_k + threadIdx.x] : 1.f;
  }
  __syncthreads();
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kRowThreads, kRowMinBlocks)
unpermute_kernel(const T* __restrict__ routed, int64_t total_rows, int64_t hidden, const int* __restrict__ row_of,
                 int top_k, const float* __restrict__ weights, T* __restrict__ out) {
  __shared__ int rows[kMaxTopK];
  __shared__ float w[kMaxTopK];
  const int64_t t = blockIdx.x;
  stage_token(row_of, weights, t, top_k, total_rows, rows, w);
  const bool weighted = weights != nullptr;
  for (int64_t i = threadIdx.x * VEC; i < hidden; i += kRowThreads * VEC) {
    float acc[VEC];
    MARIN_UNROLL
    for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
    for (int k0 = 0; k0 < top_k; k0 += kPullBatch) {
      float v[kPullBatch][VEC];  // kPullBatch loads in flight, then the sums in k order
      MARIN_UNROLL
      for (int u = 0; u < kPullBatch; ++u) {
        const int64_t row = k0 + u < top_k ? rows[k0 + u] : -1;
        if (row >= 0) load_floats<T, VEC>(routed + row * hidden + i, v[u]);
      }
      MARIN_UNROLL
      for (int u = 0; u < kPullBatch; ++u) {
        if (k0 + u >= top_k || rows[k0 + u] < 0) continue;
        MARIN_UNROLL
        for (int q = 0; q < VEC; ++q)
          acc[q] = __fadd_rn(acc[q], weighted ? __fmul_rn(v[u][q], w[k0 + u]) : v[u][q]);
      }
    }
    store_floats<T, VEC>(out + t * hidden + i, acc);
  }
}

// Blocks [0, T): token t writes w[t,k] * grad_out[t] to each kept row and, when grad_weights is set, the dot
// products <grad_out[t], routed[row]>. Blocks [T, ...): zero the padding rows (src_of kPaddingRow); the unused
// rows (kUnusedRow) are not written. grad_out is read in its own type G (T or fp32), so an fp32 gradient of
// bf16 rows is rounded once, after scaling.
template <typename T, typename G, int VEC>
__global__ void __launch_bounds__(kRowThreads, kRowMinBlocks)
unpermute_backward_kernel(const G* __restrict__ grad_out, const T* __restrict__ routed, int64_t hidden,
                          const int* __restrict__ row_of, const int* __restrict__ src_of, int64_t tokens,
                          int top_k, int64_t rows_total, const float* __restrict__ weights,
                          T* __restrict__ grad_routed, float* __restrict__ grad_weights) {
  if (blockIdx.x >= tokens) {
    using Zero = typename RawBytes<sizeof(T) * VEC>::type;
    zero_padding_rows(reinterpret_cast<Zero*>(grad_routed), hidden / VEC, rows_total,
                      (blockIdx.x - tokens) * static_cast<int64_t>(kRowThreads),
                      [&](int64_t row) { return src_of[row] == kPaddingRow; });
    return;
  }
  __shared__ int rows[kMaxTopK];
  __shared__ float w[kMaxTopK];
  __shared__ float partial[kRowWarps][kMaxTopK];
  const int64_t t = blockIdx.x;
  stage_token(row_of, weights, t, top_k, rows_total, rows, w);
  const bool dots = grad_weights != nullptr;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // k outer: grad_out[t] is re-read from L1/L2 per destination, which keeps one dot accumulator per thread
  for (int k = 0; k < top_k; ++k) {
    const int64_t row = rows[k];
    if (row < 0) continue;  // uniform across the block
    float dot = 0.f;
    for (int64_t i = threadIdx.x * VEC; i < hidden; i += kRowThreads * VEC) {
      float g[VEC], scaled[VEC];
      load_floats<G, VEC>(grad_out + t * hidden + i, g);
      MARIN_UNROLL
      for (int q = 0; q < VEC; ++q) scaled[q] = __fmul_rn(g[q], w[k]);
      store_floats<T, VEC>(grad_routed + row * hidden + i, scaled);
      if (dots) {
        float v[VEC];
        load_floats<T, VEC>(routed + row * hidden + i, v);
        MARIN_UNROLL
        for (int q = 0; q < VEC; ++q) dot = fmaf(g[q], v[q], dot);
      }
    }
    if (dots) {
      dot = warp_sum(dot);
      if (lane == 0) partial[warp][k] = dot;
    }
  }
  if (!dots) return;
  __syncthreads();
  if (threadIdx.x < top_k) {
    float sum = 0.f;
    for (int w_ = 0; w_ < kRowWarps; ++w_) sum += partial[w_][threadIdx.x];  // fixed order: deterministic
    grad_weights[t * top_k + threadIdx.x] = rows[threadIdx.x] >= 0 ? sum : 0.f;
  }
}

template <typename T>
cudaError_t launch_unpermute(const void* routed, int64_t rows, int64_t hidden, const int* row_of, int64_t tokens,
                             int top_k, const float* weights, void* out, cudaStream_t stream) {
  const int vec = row_vector(16 / sizeof(T), hidden, {RowOperand{routed, sizeof(T)}, RowOperand{out, sizeof(T)}});
  with_vector<16 / sizeof(T)>(vec, [&](auto v) {
    MARIN_LAUNCH(static_cast<unsigned>(tokens), kRowThreads, stream, unpermute_kernel<T, decltype(v)::value>)(
        static_cast<const T*>(routed), rows, hidden, row_of, top_k, weights, static_cast<T*>(out));
  });
  return cudaGetLastError();
}

template <typename T, typename G>
cudaError_t launch_unpermute_backward(const void* grad_out, const void* routed, int64_t rows, int64_t hidden,
                                      const int* row_of, const int* src_of, int64_t tokens, int top_k,
                                      const float* weights, void* grad_routed, float* grad_weights,
                                      cudaStream_t stream) {
  const int64_t blocks = tokens + (rows + kRowThreads - 1) / kRowThreads;
  if (blocks == 0) return cudaSuccess;
  constexpr int kMaxVec = 16 / (sizeof(G) > sizeof(T) ? sizeof(G) : sizeof(T));  // 16-byte accesses at most
  const int vec = row_vector(kMaxVec, hidden,
                             {RowOperand{grad_out, sizeof(G)}, RowOperand{routed, sizeof(T)},
                              RowOperand{grad_routed, sizeof(T)}});
  with_vector<kMaxVec>(vec, [&](auto v) {
    MARIN_LAUNCH(static_cast<unsigned>(blocks), kRowThreads, stream,
                 unpermute_backward_kernel<T, G, decltype(v)::value>)(
        static_cast<const G*>(grad_out), static_cast<const T*>(routed), hidden, row_of, src_of, tokens, top_k, rows,
        weights, static_cast<T*>(grad_routed), grad_weights);
  });
  return cudaGetLastError();
}

}  // namespace

int unpermute_occupancy(Occupancy* out) {  // bf16 rows, 16-byte accesses
  out[0] = occupancy_of("unpermute_kernel<bf16, 8>", unpermute_kernel<__nv_bfloat16, 8>, kRowThreads);
  out[1] = occupancy_of("unpermute_backward_kernel<bf16, bf16, 8>",
                        unpermute_backward_kernel<__nv_bfloat16, __nv_bfloat16, 8>, kRowThreads);
  return 2;
}

}  // namespace marin

using namespace marin;

extern "C" int marin_unpermute(const void* routed, int dtype, int64_t rows, int64_t hidden, const int* row_of,
                               int64_t tokens, int top_k, const float* weights, void* out, cudaStream_t stream) {
  if (rows < 0 || hidden < 0 || tokens < 0 || top_k < 0 || top_k > kMaxTopK) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  return with_dtype(dtype, [&](auto type) {
    return launch_unpermute<typename decltype(type)::type>(routed, rows, hidden, row_of, tokens, top_k, weights, out,
                                                           stream);
  });
}

extern "C" int marin_unpermute_backward(const void* grad_out, int grad_dtype, const void* routed, int dtype,
                                        int64_t rows, int64_t hidden, const int* row_of, const int* src_of,
                                        int64_t tokens, int top_k, const float* weights, void* grad_routed,
                                        float* grad_weights, cudaStream_t stream) {
  if (rows < 0 || hidden < 0 || tokens < 0 || top_k < 0 || top_k > kMaxTopK) return cudaErrorInvalidValue;
  if (grad_dtype != dtype && grad_dtype != kFloat32) return cudaErrorInvalidValue;
  return with_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    if (grad_dtype == dtype)
      return launch_unpermute_backward<T, T>(grad_out, routed, rows, hidden, row_of, src_of, tokens, top_k, weights,
                                             grad_routed, grad_weights, stream);
    return launch_unpermute_backward<T, float>(grad_out, routed, rows, hidden, row_of, src_of, tokens, top_k,
                                               weights, grad_routed, grad_weights, stream);
  });
}
