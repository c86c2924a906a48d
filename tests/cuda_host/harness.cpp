// Host harness for tests/test_cuda_host.py: compiles cuda/*.cuh with a plain C++ compiler (no CUDA) and
// replays the kernels' algorithms on the CPU with the same per-element functions. Where a kernel uses a warp
// primitive, the harness emulates it lane by lane: __match_any_sync by comparing lanes, a warp arg-max by
// folding `pick` over the lanes (the same total order, so the same winner as the butterfly).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "permute.cuh"
#include "route_topk.cuh"

using namespace marin;

namespace {

// One token of route_topk_kernel; lane l holds experts j*32 + l.
template <int VPT>
void route_token(const float* x, const float* bias, int E, int k, int mode, float scale, bool renormalize,
                 int n_group, int topk_group, int* ids, float* weights, float* lse) {
  float basis[kWarpSize][VPT], score[kWarpSize][VPT];
  uint32_t taken[kWarpSize];
  float row_max = -INFINITY, sum_exp = 0.f;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    taken[lane] = 0;
    for (int j = 0; j < VPT; ++j) {
      const int e = j * kWarpSize + lane;
      basis[lane][j] = e < E ? x[e] : -INFINITY;
      if (e >= E) taken[lane] |= 1u << j;
      row_max = fmaxf(row_max, basis[lane][j]);
    }
  }
  for (int e = 0; e < E; ++e) sum_exp += expf(x[e] - row_max);
  const float inv_sum = 1.f / sum_exp;
  for (int lane = 0; lane < kWarpSize; ++lane)
    for (int j = 0; j < VPT; ++j) {
      const int e = j * kWarpSize + lane;
      if (mode == kSoftmaxTopk) basis[lane][j] = expf(basis[lane][j] - row_max) * inv_sum;
      score[lane][j] = (bias != nullptr && e < E) ? basis[lane][j] + bias[e] : basis[lane][j];
    }
  if (n_group > 1) {  // limit_groups
    const int size = E / n_group;
    std::vector<float> row(E), groups(n_group);
    for (int e = 0; e < E; ++e) row[e] = score[e % kWarpSize][e / kWarpSize];
    for (int g = 0; g < n_group; ++g) groups[g] = group_score(row.data() + g * size, size);
    for (int e = 0; e < E; ++e)
      if (rank_among(groups.data(), n_group, e / size) >= topk_group) score[e % kWarpSize][e / kWarpSize] = -INFINITY;
  }
  Candidate chosen[kMaxTopK];
  for (int r = 0; r < k; ++r) {
    Candidate best = no_candidate();
    for (int lane = 0; lane < kWarpSize; ++lane) best = pick(best, lane_best<VPT>(score[lane], basis[lane], taken[lane], lane));
    taken[best.id % kWarpSize] |= 1u << (best.id / kWarpSize);
    chosen[r] = best;
  }
  float chosen_max = -INFINITY, gate_sum = 0.f, gate[kMaxTopK];
  for (int r = 0; r < k; ++r) chosen_max = fmaxf(chosen_max, chosen[r].basis);
  for (int r = 0; r < k; ++r) gate_sum += gate[r] = gate_of(mode, chosen[r].basis, chosen_max);
  for (int r = 0; r < k; ++r) {
    ids[r] = chosen[r].id;
    weights[r] = combine_weight(mode, gate[r], gate_sum, scale, renormalize);
  }
  *lse = logsumexp_from(row_max, sum_exp);
}

}  // namespace

extern "C" {

int host_route_topk(const float* logits, const float* bias, int64_t tokens, int E, int k, int mode, float scale,
                    int renormalize, int n_group, int topk_group, int* ids, float* weights, int* counts,
                    float* lse) {
  memset(counts, 0, sizeof(int) * E);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = logits + t * E;
    int* id = ids + t * k;
    float* w = weights + t * k;
    switch (vpt_for(E)) {
      case 1: route_token<1>(x, bias, E, k, mode, scale, renormalize, n_group, topk_group, id, w, lse + t); break;
      case 2: route_token<2>(x, bias, E, k, mode, scale, renormalize, n_group, topk_group, id, w, lse + t); break;
      case 4: route_token<4>(x, bias, E, k, mode, scale, renormalize, n_group, topk_group, id, w, lse + t); break;
      case 8: route_token<8>(x, bias, E, k, mode, scale, renormalize, n_group, topk_group, id, w, lse + t); break;
      case 16: route_token<16>(x, bias, E, k, mode, scale, renormalize, n_group, topk_group, id, w, lse + t); break;
      default: return -1;
    }
    for (int r = 0; r < k; ++r) counts[id[r]] += 1;
  }
  return 0;
}

// route_topk_backward_kernel, one token at a time.
void host_route_topk_backward(const float* grad_weights, const float* grad_lse, const float* logits, const int* ids,
                              int64_t tokens, int E, int k, int mode, float scale, int renormalize, float* grad) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = logits + t * E;
    float row_max = -INFINITY, sum_exp = 0.f;
    for (int e = 0; e < E; ++e) row_max = fmaxf(row_max, x[e]);
    for (int e = 0; e < E; ++e) sum_exp += expf(x[e] - row_max);
    const float inv_sum = 1.f / sum_exp;
    float basis[kMaxTopK], gate[kMaxTopK], own[kMaxTopK], chosen_max = -INFINITY, gate_sum = 0.f, dot = 0.f,
          chosen_sum = 0.f;
    for (int r = 0; r < k; ++r) {
      const float logit = x[ids[t * k + r]];
      basis[r] = mode == kSoftmaxTopk ? expf(logit - row_max) * inv_sum : logit;
      chosen_max = fmaxf(chosen_max, basis[r]);
    }
    for (int r = 0; r < k; ++r) {
      gate[r] = gate_of(mode, basis[r], chosen_max);
      gate_sum += gate[r];
      dot += grad_weights[t * k + r] * gate[r];
    }
    for (int r = 0; r < k; ++r) {
      own[r] = chosen_logit_grad(mode, grad_weights[t * k + r], gate[r], gate_sum, dot, scale, renormalize != 0);
      chosen_sum += own[r];
    }
    for (int e = 0; e < E; ++e) {
      float g = dense_logit_grad(mode, expf(x[e] - row_max) * inv_sum, grad_lse[t], chosen_sum);
      for (int r = 0; r < k; ++r)
        if (ids[t * k + r] == e) g += own[r];
      grad[t * E + e] = g;
    }
  }
}

// permute's index work: rank, scan, placement and padding, as the three kernels do it. Returns the number
// of routed rows that were not written exactly once (0 when the kernels cover every row).
int host_permute(const int* expert_ids, int64_t tokens, int K, int E, int align, int capacity, int* row_of,
                 int* src_of, int* offsets) {
  const int64_t N = tokens * K, tiles = permute_tiles(N), R = permute_rows(tokens, K, E, align);
  std::vector<int> hist(permute_workspace_ints(N, E)), writes(R, 0);
  int* kept = hist.data() + tiles * E;
  for (int64_t tile = 0; tile < tiles; ++tile) {  // permute_rank_kernel
    std::vector<int> running(E, 0), warp_counts(kPermuteWarps * E, 0);
    for (int round = 0; round < kPermuteRounds; ++round) {
      int e_of[kPermuteThreads];
      uint32_t same[kPermuteThreads];
      for (int tid = 0; tid < kPermuteThreads; ++tid) {
        const int64_t flat = tile * kPermuteTile + round * kPermuteThreads + tid;
        e_of[tid] = flat < N ? routed_expert(expert_ids[flat], E) : -1;
      }
      for (int tid = 0; tid < kPermuteThreads; ++tid) {  // __match_any_sync
        same[tid] = 0;
        const int warp_first = tid / kWarpSize * kWarpSize;
        for (int l = 0; l < kWarpSize; ++l)
          if (e_of[warp_first + l] == e_of[tid]) same[tid] |= 1u << l;
      }
      for (int tid = 0; tid < kPermuteThreads; ++tid)
        if (e_of[tid] >= 0 && is_last_of_group(same[tid], tid % kWarpSize))
          warp_counts[tid / kWarpSize * E + e_of[tid]] = popcount32(same[tid]);
      for (int tid = 0; tid < kPermuteThreads; ++tid) {
        const int e = e_of[tid];
        if (e >= 0)
          row_of[tile * kPermuteTile + round * kPermuteThreads + tid] =
              tile_rank(running[e], &warp_counts[e], E, tid / kWarpSize, same[tid], tid % kWarpSize);
      }
      for (int tid = 0; tid < kPermuteThreads; ++tid) {
        const int e = e_of[tid];
        if (e >= 0 && is_last_of_group(same[tid], tid % kWarpSize)) {
          running[e] += popcount32(same[tid]);
          warp_counts[tid / kWarpSize * E + e] = 0;
        }
      }
    }
    for (int e = 0; e < E; ++e) hist[tile * E + e] = running[e];
  }
  int total_rows = 0;  // permute_scan_kernel
  for (int e = 0; e < E; ++e) {
    kept[e] = kept_count(scan_tile_column(hist.data(), tiles, E, e), capacity);
    offsets[e] = total_rows;
    total_rows += padded_count(kept[e], align);
  }
  offsets[E] = total_rows;
  for (int64_t flat = 0; flat < N; ++flat) {  // permute_scatter_kernel, token blocks
    const int e = routed_expert(expert_ids[flat], E);
    int row = -1;
    if (e >= 0) row = dest_row(offsets[e], hist[(flat / kPermuteTile) * E + e] + row_of[flat], capacity);
    row_of[flat] = row;
    if (row >= 0) {
      src_of[row] = static_cast<int>(flat);
      writes[row] += 1;
    }
  }
  for (int64_t row = 0; row < R; ++row)  // permute_scatter_kernel, padding blocks
    if (is_padding_row(offsets, kept, E, row)) {
      src_of[row] = -1;
      writes[row] += 1;
    }
  int bad = 0;
  for (int64_t row = 0; row < R; ++row) bad += writes[row] != 1;
  return bad;
}

// Single functions, for adversarial unit tests.
int host_better(float a, int id_a, float b, int id_b) { return better(a, id_a, b, id_b); }
float host_group_score(const float* score, int size) { return group_score(score, size); }
int host_expert_of_row(const int* offsets, int E, int64_t row) { return expert_of_row(offsets, E, row); }
int host_padded_count(int kept, int align) { return padded_count(kept, align); }
int host_vpt_for(int E) { return vpt_for(E); }

}  // extern "C"
