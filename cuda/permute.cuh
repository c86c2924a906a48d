// permute's per-element logic (the stable counting sort), used by the kernels in permute.cu. The contract is
// marin_model/ops/contract.py's module docstring.
//
// The N = T*K entries (flat index t*K+k) are cut into tiles of kPermuteTile. A tile is ranked in rounds of
// kPermuteThreads consecutive entries, one entry per thread; within a round, a warp finds the lanes that
// hold the same expert (__match_any_sync) and counts them per warp. An entry's rank in its tile is then
//   (its expert's entries in earlier rounds) + (in earlier warps of this round) + (in lower lanes of its warp),
// which is the stable order. The per-tile totals, laid out [tile][expert], are scanned per expert over the
// tiles (an expert's rank base in each tile) and the padded per-expert counts over the experts (offsets).
// No global atomics anywhere, so the result is one function of the input.
#pragma once

#include "common.cuh"

namespace marin {

constexpr int kPermuteThreads = 256;                           // threads of the ranking kernel
constexpr int kPermuteWarps = kPermuteThreads / kWarpSize;     // warps of one round
constexpr int kPermuteRounds = 4;                              // rounds per tile
constexpr int kPermuteTile = kPermuteThreads * kPermuteRounds; // entries per tile

// The static bound on routed rows: every group padded by at most align-1 rows, nothing dropped.
MARIN_HD int64_t permute_rows(int64_t tokens, int top_k, int num_experts, int align) {
  return tokens * top_k + static_cast<int64_t>(num_experts) * (align - 1);
}

MARIN_HD int64_t permute_tiles(int64_t entries) { return (entries + kPermuteTile - 1) / kPermuteTile; }

// Scratch ints the kernels need: the [tile][expert] histogram, then the kept count of each expert.
MARIN_HD int64_t permute_workspace_ints(int64_t entries, int num_experts) {
  return (permute_tiles(entries) + 1) * num_experts;
}

// The expert an entry goes to, or -1 when dropped. Ids outside [-1, E) count as dropped: checking them
// would cost a host synchronisation (the CPU reference raises ValueError instead).
MARIN_HD int routed_expert(int id, int num_experts) { return id >= 0 && id < num_experts ? id : -1; }

// Lanes below `lane` in `mask`.
MARIN_HD int lanes_below(uint32_t mask, int lane) { return popcount32(mask & ((1u << lane) - 1u)); }

// The highest lane holding a given expert writes its warp's count.
MARIN_HD bool is_last_of_group(uint32_t same_mask, int lane) { return (same_mask >> lane) == 1u; }

// An entry's rank among its expert's entries in its tile (see the header comment). `warp_counts[w*stride]`
// is warp w's count of the entry's expert in the current round.
MARIN_HD int tile_rank(int running, const int* warp_counts, int stride, int warp, uint32_t same_mask, int lane) {
  int rank = running;
  for (int w = 0; w < warp; ++w) rank += warp_counts[w * stride];
  return rank + lanes_below(same_mask, lane);
}

// Exclusive scan of expert e's column of the [tile][expert] histogram, in place: each tile's count becomes
// the number of e's entries in earlier tiles. Returns e's total. Loads go kScanBatch at a time, so that one
// thread has that many in flight instead of one.
constexpr int kScanBatch = 16;

MARIN_HD int scan_tile_column(int* hist, int64_t tiles, int num_experts, int e) {
  int running = 0;
  for (int64_t first = 0; first < tiles; first += kScanBatch) {
    int count[kScanBatch];
    MARIN_UNROLL
    for (int b = 0; b < kScanBatch; ++b) count[b] = first + b < tiles ? hist[(first + b) * num_experts + e] : 0;
    MARIN_UNROLL
    for (int b = 0; b < kScanBatch; ++b) {
      if (first + b < tiles) hist[(first + b) * num_experts + e] = running;
      running += count[b];
    }
  }
  return running;
}

// Entries an expert keeps: all, or the first `capacity` in stable order when capacity > 0.
MARIN_HD int kept_count(int total, int capacity) { return capacity > 0 && total > capacity ? capacity : total; }

// Rows an expert's group takes: its kept count rounded up to a multiple of `align`.
MARIN_HD int padded_count(int kept, int align) { return (kept + align - 1) / align * align; }

// The destination row of the entry ranked `rank` in its expert, or -1 when capacity drops it.
MARIN_HD int dest_row(int expert_offset, int rank, int capacity) {
  return capacity > 0 && rank >= capacity ? -1 : expert_offset + rank;
}

// The expert whose padded range [offsets[e], offsets[e+1]) holds `row`; num_experts past the last range.
// Empty ranges are skipped: the answer is the last e with offsets[e] <= row.
MARIN_HD int expert_of_row(const int* offsets, int num_experts, int64_t row) {
  if (row >= offsets[num_experts]) return num_experts;
  int lo = 0, hi = num_experts;  // offsets[lo] <= row < offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// What a row holds: an entry (kFilledRow; its token's block writes its src_of), group padding (kPaddingRow)
// or nothing, past the last group (kUnusedRow). The last two are the src_of of such rows.
constexpr int kFilledRow = 0;

MARIN_HD int row_kind(const int* offsets, const int* kept, int num_experts, int64_t row) {
  const int e = expert_of_row(offsets, num_experts, row);
  if (e == num_experts) return kUnusedRow;
  return row - offsets[e] < kept[e] ? kFilledRow : kPaddingRow;
}

}  // namespace marin
