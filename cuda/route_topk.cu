// route_topk and its backward: one warp per token, scores in registers (see route_topk.cuh).
#include <type_traits>

#include "device.cuh"
#include "marin_kernels.h"
#include "route_topk.cuh"

namespace marin {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kRouteThreads = kRouteWarps * kWarpSize;
constexpr int kRouteBlocksPerSM = 8;  // a persistent grid: fewer blocks, fewer count flushes

// Each kernel's register budget, as the blocks of 128 threads that must fit on an SM (65,536 registers /
// (128 x blocks) per thread). Left to their own heuristics, ptxas versions trade registers for occupancy
// differently and spilled 4-16 bytes in different instantiations (13.0: the backward on sm_100; 13.5: the
// forward at 8 and 12 scores per lane); a stated budget spills nothing with either.
constexpr int route_forward_blocks(int vpt) { return vpt <= 4 ? 8 : vpt <= 8 ? 6 : vpt <= 12 ? 5 : 4; }
constexpr int route_backward_blocks(int vpt) { return vpt <= 12 ? 8 : 7; }

// Group-limited routing: experts outside the topk_group best groups get score -inf. `row` and `groups` are
// this warp's shared scratch of kMaxExperts floats each.
template <int VPT>
__device__ __forceinline__ void limit_groups(float (&score)[VPT], float* row, float* groups, int num_experts,
                                             int n_group, int topk_group, int lane) {
  const int size = num_experts / n_group;
  MARIN_UNROLL
  for (int j = 0; j < VPT; ++j)
    if (j * kWarpSize + lane < num_experts) row[j * kWarpSize + lane] = score[j];
  __syncwarp();
  for (int g = lane; g < n_group; g += kWarpSize) groups[g] = group_score(row + g * size, size);
  __syncwarp();
  for (int g = lane; g < n_group; g += kWarpSize) row[g] = rank_among(groups, n_group, g) < topk_group ? 1.f : 0.f;
  __syncwarp();
  const float inv_size = 1.f / static_cast<float>(size);
  MARIN_UNROLL
  for (int j = 0; j < VPT; ++j) {
    const int e = j * kWarpSize + lane;
    if (e < num_experts && row[group_of(e, inv_size)] == 0.f) score[j] = -INFINITY;
  }
  __syncwarp();  // the next token rewrites row
}

// Loads a token's logits (lane holds e = j*32 + lane) and reduces max and sum(exp(x - max)) over the row.
// Slots past E are marked in `invalid` and hold -inf. A NaN logit makes the max, the sum and lse NaN (torch).
template <int VPT, typename In>
__device__ __forceinline__ void load_row(const In* __restrict__ row, int num_experts, int lane, float (&x)[VPT],
                                         uint32_t& invalid, float& row_max, float& sum_exp) {
  invalid = 0;
  row_max = -INFINITY;
  MARIN_UNROLL
  for (int j = 0; j < VPT; ++j) {
    const int e = j * kWarpSize + lane;
    if (e < num_experts) {
      x[j] = to_float(row[e]);
    } else {
      x[j] = -INFINITY;
      invalid |= 1u << j;
    }
    row_max = max_or_nan(row_max, x[j]);
  }
  row_max = warp_max(row_max);
  float sum = 0.f;
  MARIN_UNROLL
  for (int j = 0; j < VPT; ++j)
    if (!((invalid >> j) & 1u)) sum += expf(x[j] - row_max);
  sum_exp = warp_sum(sum);
}

template <int VPT, typename In>
__global__ void __launch_bounds__(kRouteThreads, route_forward_blocks(VPT))
route_topk_kernel(const In* __restrict__ logits, const float* __restrict__ bias, int64_t tokens, int num_experts,
                  int k, int mode, float scale, bool renormalize, int n_group, int topk_group,
                  int* __restrict__ expert_ids, float* __restrict__ weights, int* __restrict__ counts,
                  float* __restrict__ lse) {
  __shared__ int block_counts[kMaxExperts];
  __shared__ float rows[kRouteWarps][kMaxExperts];
  __shared__ float groups[kRouteWarps][kMaxExperts];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) block_counts[e] = 0;
  __syncthreads();

  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kRouteWarps) {
    float basis[VPT], score[VPT];
    uint32_t invalid;
    float row_max, sum_exp;
    load_row<VPT>(logits + t * num_experts, num_experts, lane, basis, invalid, row_max, sum_exp);
    const float inv_sum = 1.f / sum_exp;
    MARIN_UNROLL
    for (int j = 0; j < VPT; ++j) {
      const int e = j * kWarpSize + lane;
      if (mode == kSoftmaxTopk) basis[j] = expf(basis[j] - row_max) * inv_sum;
      score[j] = (bias != nullptr && e < num_experts) ? basis[j] + bias[e] : basis[j];
    }
    if (n_group > 1) limit_groups<VPT>(score, rows[warp], groups[warp], num_experts, n_group, topk_group, lane);

    uint32_t key[VPT];
    MARIN_UNROLL
    for (int j = 0; j < VPT; ++j) key[j] = ((invalid >> j) & 1u) ? kNoKey : select_key(score[j]);
    uint32_t best_key;
    int best_slot;
    lane_best<VPT>(key, best_key, best_slot);
    int my_id = 0;
    float my_basis = 0.f;
    for (int r = 0; r < k; ++r) {  // lane r keeps the r-th choice
      const uint32_t top = __reduce_max_sync(kFullMask, best_key);
      const unsigned id = __reduce_min_sync(kFullMask, best_key == top ? best_slot * kWarpSize + lane : 0xffffffffu);
      const int owner = static_cast<int>(id % kWarpSize);
      float lane_basis = 0.f;
      MARIN_UNROLL
      for (int j = 0; j < VPT; ++j)
        if (j == best_slot) lane_basis = basis[j];
      const float chosen_basis = __shfl_sync(kFullMask, lane_basis, owner);
      if (lane == r) {
        my_id = static_cast<int>(id);
        my_basis = chosen_basis;
      }
      if (lane == owner) {  // the winner's slot leaves; only this lane's best changes
        MARIN_UNROLL
        for (int j = 0; j < VPT; ++j)
          if (j == best_slot) key[j] = kNoKey;
        lane_best<VPT>(key, best_key, best_slot);
      }
    }
    const bool chosen = lane < k;
    const float chosen_max = warp_max(chosen ? my_basis : -INFINITY);
    const float gate = chosen ? gate_of(mode, my_basis, chosen_max) : 0.f;
    const float gate_sum = warp_sum(gate);
    if (chosen) {
      expert_ids[t * k + lane] = my_id;
      weights[t * k + lane] = combine_weight(mode, gate, gate_sum, scale, renormalize);
      atomicAdd(&block_counts[my_id], 1);  // shared-memory integer adds: order-independent
    }
    if (lane == 0) lse[t] = logsumexp_from(row_max, sum_exp);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
    if (block_counts[e] != 0) atomicAdd(&counts[e], block_counts[e]);
}

template <int VPT, typename In>
__global__ void __launch_bounds__(kRouteThreads, route_backward_blocks(VPT))
route_topk_backward_kernel(const float* __restrict__ grad_weights, const float* __restrict__ grad_lse,
                           const In* __restrict__ logits, const int* __restrict__ expert_ids, int64_t tokens,
                           int num_experts, int k, int mode, float scale, bool renormalize,
                           In* __restrict__ grad_logits) {
  __shared__ int chosen_ids[kRouteWarps][kMaxTopK];
  __shared__ float chosen_grads[kRouteWarps][kMaxTopK];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kRouteWarps) {
    const In* row = logits + t * num_experts;
    float x[VPT];
    uint32_t invalid;
    float row_max, sum_exp;
    load_row<VPT>(row, num_experts, lane, x, invalid, row_max, sum_exp);
    const float inv_sum = 1.f / sum_exp;

    const bool chosen = lane < k;
    const int id = chosen ? expert_ids[t * k + lane] : 0;
    const float g = chosen ? grad_weights[t * k + lane] : 0.f;
    const float logit = chosen ? to_float(row[id]) : -INFINITY;
    const float basis = mode == kSoftmaxTopk ? expf(logit - row_max) * inv_sum : logit;
    const float chosen_max = warp_max(chosen ? basis : -INFINITY);
    const float gate = chosen ? gate_of(mode, basis, chosen_max) : 0.f;
    const float gate_sum = warp_sum(gate);
    const float dot = warp_sum(g * gate);
    const float own = chosen ? chosen_logit_grad(mode, g, gate, gate_sum, dot, scale, renormalize) : 0.f;
    const float chosen_sum = warp_sum(own);
    if (chosen) {
      chosen_ids[warp][lane] = id;
      chosen_grads[warp][lane] = own;
    }
    __syncwarp();
    const float glse = grad_lse[t];
    MARIN_UNROLL
    for (int j = 0; j < VPT; ++j) {
      const int e = j * kWarpSize + lane;
      if ((invalid >> j) & 1u) continue;
      float grad = dense_logit_grad(mode, expf(x[j] - row_max) * inv_sum, glse, chosen_sum);
      for (int r = 0; r < k; ++r)
        if (chosen_ids[warp][r] == e) grad += chosen_grads[warp][r];
      grad_logits[t * num_experts + e] = from_float<In>(grad);
    }
    __syncwarp();  // the next token rewrites chosen_*
  }
}

// The persistent grid of `kernel`: one block per kRouteWarps tokens, at most kRouteBlocksPerSM per SM and no
// more than can be resident at once (the forward at 12 scores per lane fits 5-6): a block past that would
// start only when another had finished its share, and then do its own share alone.
template <typename Kernel>
int route_grid(Kernel kernel, int64_t tokens) {
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kRouteThreads, 0) != cudaSuccess ||
      resident < 1 || resident > kRouteBlocksPerSM)
    resident = kRouteBlocksPerSM;
  const int64_t needed = (tokens + kRouteWarps - 1) / kRouteWarps;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * resident;
  return static_cast<int>(needed < cap ? needed : cap);
}

// Calls launch(std::integral_constant<int, VPT>{}) with the scores-per-lane that E needs, then reports.
template <typename Launch>
cudaError_t with_vpt(int num_experts, Launch launch) {
  switch (vpt_for(num_experts)) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 8: launch(std::integral_constant<int, 8>{}); break;
    case 12: launch(std::integral_constant<int, 12>{}); break;
    case 16: launch(std::integral_constant<int, 16>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

bool route_args_ok(int64_t tokens, int num_experts, int k, int mode, int n_group, int topk_group) {
  if (tokens < 0 || num_experts < 1 || num_experts > kMaxExperts || k < 1 || k > kMaxTopK || k > num_experts)
    return false;
  if (mode < kSigmoid || mode > kTopkSoftmax) return false;
  if (n_group > 1 && (num_experts % n_group != 0 || topk_group < 1 || topk_group > n_group)) return false;
  return true;
}

}  // namespace

int route_topk_occupancy(Occupancy* out) {  // E = 384 (12 scores per lane), bf16 and fp32 logits
  out[0] = occupancy_of("route_topk_kernel<12, bf16>", route_topk_kernel<12, __nv_bfloat16>, kRouteThreads);
  out[1] = occupancy_of("route_topk_kernel<12, fp32>", route_topk_kernel<12, float>, kRouteThreads);
  out[2] = occupancy_of("route_topk_backward_kernel<12, fp32>", route_topk_backward_kernel<12, float>, kRouteThreads);
  return 3;
}

}  // namespace marin

using namespace marin;

extern "C" int marin_route_topk(const void* logits, int dtype, const float* bias, int64_t tokens, int num_experts,
                                int k, int mode, float scale, int renormalize, int n_group, int topk_group,
                                int* expert_ids, float* weights, int* counts, float* lse, cudaStream_t stream) {
  if (!route_args_ok(tokens, num_experts, k, mode, n_group, topk_group)) return cudaErrorInvalidValue;
  const cudaError_t err = cudaMemsetAsync(counts, 0, sizeof(int) * num_experts, stream);
  if (err != cudaSuccess || tokens == 0) return err;
  return with_dtype(dtype, [&](auto type) {
    using In = typename decltype(type)::type;
    return with_vpt(num_experts, [&](auto vpt) {
      const auto kernel = route_topk_kernel<decltype(vpt)::value, In>;
      MARIN_LAUNCH(route_grid(kernel, tokens), kRouteThreads, stream, kernel)(
          static_cast<const In*>(logits), bias, tokens, num_experts, k, mode, scale, renormalize != 0, n_group,
          topk_group, expert_ids, weights, counts, lse);
    });
  });
}

extern "C" int marin_route_topk_backward(const float* grad_weights, const float* grad_lse, const void* logits,
                                         int dtype, const int* expert_ids, int64_t tokens, int num_experts, int k,
                                         int mode, float scale, int renormalize, void* grad_logits,
                                         cudaStream_t stream) {
  if (!route_args_ok(tokens, num_experts, k, mode, 1, 1)) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  return with_dtype(dtype, [&](auto type) {
    using In = typename decltype(type)::type;
    return with_vpt(num_experts, [&](auto vpt) {
      const auto kernel = route_topk_backward_kernel<decltype(vpt)::value, In>;
      MARIN_LAUNCH(route_grid(kernel, tokens), kRouteThreads, stream, kernel)(
          grad_weights, grad_lse, static_cast<const In*>(logits), expert_ids, tokens, num_experts, k, mode, scale,
          renormalize != 0, static_cast<In*>(grad_logits));
    });
  });
}
