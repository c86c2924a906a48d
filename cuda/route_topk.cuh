// route_topk's per-element logic, used by the kernels in route_topk.cu. The contract is
// marin_model/ops/contract.py's module docstring.
//
// Layout used by the kernels: one warp per token, lane `l` holds experts e = j*32 + l for j < VPT
// (VPT = vpt_for(E) scores per lane, kept in registers and indexed only by unrolled loops).
#pragma once

#include "common.cuh"

namespace marin {

enum RouteMode : int { kSigmoid = 0, kSoftmaxTopk = 1, kTopkSoftmax = 2 };

// The tie rule. The reference sorts -score ascending with a stable sort, so: larger score first; equal
// scores -> lower expert id; NaN after everything, -inf included (torch sorts NaN last); NaNs by id.
MARIN_HD bool better(float score_a, int id_a, float score_b, int id_b) {
  const bool nan_a = is_nan(score_a), nan_b = is_nan(score_b);
  if (nan_a || nan_b) return nan_b && (!nan_a || id_a < id_b);
  return score_a > score_b || (score_a == score_b && id_a < id_b);
}

// The selection key of a score: an unsigned integer in the tie rule's order, so a warp picks the best with
// one __reduce_max_sync (and the lowest id among equal keys with one __reduce_min_sync). -0 and +0 get the
// same key; every NaN gets 1, below every number; 0 (kNoKey) marks a slot that is taken or past E.
constexpr uint32_t kNoKey = 0;

MARIN_HD uint32_t select_key(float score) {
  if (is_nan(score)) return 1u;
  const uint32_t bits = float_bits(score == 0.f ? 0.f : score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Scores per lane for E experts: the smallest of 1, 2, 4, 8, 12, 16 with 32*VPT >= E (0 when E > 512).
// 12 for E = 257..384 (Marin's 384 experts), where 16 would leave a quarter of the registers idle.
MARIN_HD int vpt_for(int num_experts) {
  const int choices[] = {1, 2, 4, 8, 12, 16};
  for (int vpt : choices)
    if (vpt * kWarpSize >= num_experts) return vpt;
  return 0;
}

// A lane's best slot: the largest key, the lowest slot (so the lowest expert id) among equal keys.
template <int VPT>
MARIN_HD void lane_best(const uint32_t (&key)[VPT], uint32_t& best_key, int& best_slot) {
  best_key = kNoKey;
  best_slot = 0;
  MARIN_UNROLL
  for (int j = 0; j < VPT; ++j) {
    if (key[j] > best_key) {
      best_key = key[j];
      best_slot = j;
    }
  }
}

// The group of expert e for groups of `size` experts, from 1/size: (e + 0.5) / size is at least 1/(2*size)
// away from an integer, far more than fp32's error for e < 512, so the floor is exact (no integer division).
MARIN_HD int group_of(int e, float inv_size) { return static_cast<int>((static_cast<float>(e) + 0.5f) * inv_size); }

// Group score of group-limited routing: the sum of the group's two largest selection scores (the single
// score for a group of one). NaN if the group holds a NaN: the reference takes torch.topk, which ranks
// NaN highest.
MARIN_HD float group_score(const float* score, int size) {
  float first = -INFINITY, second = -INFINITY;
  bool nan = false;
  for (int i = 0; i < size; ++i) {
    const float v = score[i];
    nan = nan || is_nan(v);
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  if (nan) return NAN;
  return size == 1 ? first : first + second;
}

// How many of values[0..n) beat values[i] under the tie rule: i is kept among the best m iff rank < m.
MARIN_HD int rank_among(const float* values, int n, int i) {
  int rank = 0;
  for (int j = 0; j < n; ++j) rank += better(values[j], j, values[i], i) ? 1 : 0;
  return rank;
}

// logsumexp from a row's max and sum(exp(x - max)), with torch's answers for infinite maxima.
MARIN_HD float logsumexp_from(float row_max, float sum_exp) {
  return isinf(row_max) ? row_max : row_max + logf(sum_exp);
}

MARIN_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The gate of a chosen expert before normalisation: sigmoid(logit), the probability, or for topk_softmax
// exp(logit - max over the chosen logits).
MARIN_HD float gate_of(int mode, float basis, float chosen_max) {
  if (mode == kSigmoid) return sigmoid(basis);
  if (mode == kSoftmaxTopk) return basis;
  return expf(basis - chosen_max);
}

// The combine weight from a gate and the sum of the k chosen gates.
MARIN_HD float combine_weight(int mode, float gate, float gate_sum, float scale, bool renormalize) {
  const bool divide = renormalize || mode == kTopkSoftmax;
  return (divide ? gate / gate_sum : gate) * scale;
}

// Backward, the part of d loss / d logit[e] that a chosen expert adds at its own logit. `g` is its weight
// gradient, `gate_sum` = sum of the chosen gates, `dot` = sum of g*gate over the chosen. For softmax_topk
// this is dL/dp * p; the remaining softmax term is dense_logit_grad's (`chosen_sum` = sum of these values).
MARIN_HD float chosen_logit_grad(int mode, float g, float gate, float gate_sum, float dot, float scale,
                                 bool renormalize) {
  if (mode == kTopkSoftmax) return scale * (gate / gate_sum) * (g - dot / gate_sum);
  const float dgate = renormalize ? scale * (g - dot / gate_sum) / gate_sum : scale * g;
  return mode == kSigmoid ? dgate * gate * (1.0f - gate) : dgate * gate;
}

// Backward, the part of d loss / d logit[e] every expert gets: through lse, and for softmax_topk through the
// softmax normaliser. `prob` = softmax(logits)[e].
MARIN_HD float dense_logit_grad(int mode, float prob, float grad_lse, float chosen_sum) {
  return mode == kSoftmaxTopk ? prob * (grad_lse - chosen_sum) : prob * grad_lse;
}

}  // namespace marin
