// permute: a deterministic, stable counting sort of token copies by expert (see permute.cuh), in three
// kernels: rank (per-tile histograms and in-tile ranks), scan (over tiles per expert, then over experts),
// scatter (one block per token: read its row once, write its k destinations; extra blocks zero the
// padding rows). No global atomics, no host synchronisation: the output is sized by the static bound R, and
// its rows past the last group (offsets[E]) are unused: only their src_of is written.
#include "device.cuh"
#include "marin_kernels.h"
#include "permute.cuh"

namespace marin {
namespace {

constexpr int kScanThreads = kMaxExperts;  // one thread per expert

// Ranks each entry of tile blockIdx.x among its expert's entries in the tile (written to rank_in_tile,
// which is row_of's storage until the scatter kernel overwrites it) and writes the tile's histogram row.
__global__ void __launch_bounds__(kPermuteThreads)
permute_rank_kernel(const int* __restrict__ expert_ids, int64_t entries, int num_experts,
                    int* __restrict__ rank_in_tile, int* __restrict__ hist) {
  __shared__ int running[kMaxExperts];
  __shared__ int warp_counts[kPermuteWarps][kMaxExperts];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int e = threadIdx.x; e < num_experts; e += kPermuteThreads) {
    running[e] = 0;
    MARIN_UNROLL
    for (int w = 0; w < kPermuteWarps; ++w) warp_counts[w][e] = 0;
  }
  __syncthreads();
  const int64_t tile_first = static_cast<int64_t>(blockIdx.x) * kPermuteTile;
  int expert_of[kPermuteRounds];  // all of this thread's loads first, then the rounds
  MARIN_UNROLL
  for (int round = 0; round < kPermuteRounds; ++round) {
    const int64_t flat = tile_first + round * kPermuteThreads + threadIdx.x;
    expert_of[round] = flat < entries ? routed_expert(expert_ids[flat], num_experts) : -1;
  }
  MARIN_UNROLL
  for (int round = 0; round < kPermuteRounds; ++round) {
    const int64_t flat = tile_first + round * kPermuteThreads + threadIdx.x;
    const int e = expert_of[round];
    const uint32_t same = __match_any_sync(kFullMask, e);
    const bool last = is_last_of_group(same, lane);
    if (e >= 0 && last) warp_counts[warp][e] = popcount32(same);
    __syncthreads();
    if (e >= 0) rank_in_tile[flat] = tile_rank(running[e], &warp_counts[0][e], kMaxExperts, warp, same, lane);
    __syncthreads();
    if (e >= 0 && last) {
      atomicAdd(&running[e], popcount32(same));  // shared memory; integer adds commute
      warp_counts[warp][e] = 0;
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < num_experts; e += kPermuteThreads)
    hist[static_cast<int64_t>(blockIdx.x) * num_experts + e] = running[e];
}

// One block: expert e's thread scans its histogram column (rank bases per tile, in place), then the block
// scans the padded group sizes into offsets.
__global__ void __launch_bounds__(kScanThreads)
permute_scan_kernel(int* __restrict__ hist, int64_t tiles, int num_experts, int align, int capacity,
                    int* __restrict__ kept, int* __restrict__ offsets) {
  __shared__ int warp_totals[kScanThreads / kWarpSize];
  const int e = threadIdx.x, lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int padded = 0;
  if (e < num_experts) {
    const int kept_e = kept_count(scan_tile_column(hist, tiles, num_experts, e), capacity);
    kept[e] = kept_e;
    padded = padded_count(kept_e, align);
  }
  int inclusive = padded;
  MARIN_UNROLL
  for (int d = 1; d < kWarpSize; d *= 2) {
    const int up = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  const int exclusive = before + inclusive - padded;
  if (e < num_experts) offsets[e] = exclusive;
  if (e == num_experts - 1) offsets[num_experts] = exclusive + padded;
}

// Blocks [0, T): token t places its k entries (row_of, src_of) and copies its row to each destination.
// Blocks [T, ...): kRowThreads rows each, set the src_of of the rows no entry fills (kPaddingRow or
// kUnusedRow) and zero the padding rows; unused rows keep whatever the buffer held.
template <typename V>
__global__ void __launch_bounds__(kRowThreads)
permute_scatter_kernel(const V* __restrict__ x, int64_t row_vecs, const int* __restrict__ expert_ids,
                       int64_t tokens, int top_k, int num_experts, int capacity, const int* __restrict__ tile_base,
                       const int* __restrict__ offsets, const int* __restrict__ kept, int* __restrict__ row_of,
                       int* __restrict__ src_of, int64_t rows, V* __restrict__ routed) {
  if (blockIdx.x >= tokens) {
    zero_padding_rows(routed, row_vecs, rows, (blockIdx.x - tokens) * static_cast<int64_t>(kRowThreads),
                      [&](int64_t row) {
                        const int kind = row_kind(offsets, kept, num_experts, row);
                        if (kind != kFilledRow) src_of[row] = kind;
                        return kind == kPaddingRow;
                      });
    return;
  }
  __shared__ int dest[kMaxTopK];
  const int64_t t = blockIdx.x;
  const V* src = x + t * row_vecs;
  int64_t i = threadIdx.x;  // two loads in flight per thread; the first two are issued before the barrier
  V a = i < row_vecs ? src[i] : V{};
  V b = i + kRowThreads < row_vecs ? src[i + kRowThreads] : V{};
  if (threadIdx.x < top_k) {
    const int64_t flat = t * top_k + threadIdx.x;
    const int e = routed_expert(expert_ids[flat], num_experts);
    int row = -1;
    if (e >= 0) {
      const int rank = tile_base[(flat / kPermuteTile) * num_experts + e] + row_of[flat];
      row = dest_row(offsets[e], rank, capacity);
    }
    row_of[flat] = row;
    if (row >= 0) src_of[row] = static_cast<int>(flat);
    dest[threadIdx.x] = row;
  }
  __syncthreads();
  for (; i < row_vecs; i += 2 * kRowThreads) {
    const int64_t i2 = i + kRowThreads;
    if (i != threadIdx.x) {
      a = src[i];
      b = i2 < row_vecs ? src[i2] : V{};
    }
    for (int k = 0; k < top_k; ++k) {
      const int64_t row = dest[k];
      if (row < 0) continue;
      routed[row * row_vecs + i] = a;
      if (i2 < row_vecs) routed[row * row_vecs + i2] = b;
    }
  }
}

template <typename V>
cudaError_t launch_scatter(const void* x, int64_t row_bytes, const int* expert_ids, int64_t tokens, int top_k,
                           int num_experts, int capacity, const int* tile_base, const int* offsets,
                           const int* kept, int* row_of, int* src_of, int64_t rows, void* routed,
                           cudaStream_t stream) {
  const int64_t blocks = tokens + (rows + kRowThreads - 1) / kRowThreads;
  if (blocks == 0) return cudaSuccess;
  MARIN_LAUNCH(static_cast<unsigned>(blocks), kRowThreads, stream, permute_scatter_kernel<V>)(
      static_cast<const V*>(x), row_bytes / static_cast<int64_t>(sizeof(V)), expert_ids, tokens, top_k,
      num_experts, capacity, tile_base, offsets, kept, row_of, src_of, rows, static_cast<V*>(routed));
  return cudaGetLastError();
}

// The widest access (16, 8, 4, 2 or 1 bytes) that divides the row size and both base addresses.
int access_bytes(int64_t row_bytes, const void* a, const void* b) {
  const uint64_t bits = static_cast<uint64_t>(row_bytes) | reinterpret_cast<uintptr_t>(a) |
                        reinterpret_cast<uintptr_t>(b);
  for (int width = 16; width > 1; width /= 2)
    if (bits % width == 0) return width;
  return 1;
}

}  // namespace

int permute_occupancy(Occupancy* out) {
  out[0] = occupancy_of("permute_rank_kernel", permute_rank_kernel, kPermuteThreads);
  out[1] = occupancy_of("permute_scan_kernel", permute_scan_kernel, kScanThreads);
  out[2] = occupancy_of("permute_scatter_kernel<16 bytes>", permute_scatter_kernel<uint4>, kRowThreads);
  return 3;
}

}  // namespace marin

using namespace marin;

extern "C" size_t marin_permute_workspace_bytes(int64_t tokens, int top_k, int num_experts) {
  return sizeof(int) * static_cast<size_t>(permute_workspace_ints(tokens * top_k, num_experts));
}

extern "C" int marin_permute(const void* x, int64_t tokens, int64_t hidden, int elem_size, const int* expert_ids,
                             int top_k, int num_experts, int align, int capacity, void* routed, int* row_of,
                             int* src_of, int* offsets, void* workspace, cudaStream_t stream) {
  if (tokens < 0 || hidden < 0 || elem_size < 1 || top_k < 0 || top_k > kMaxTopK || num_experts < 1 ||
      num_experts > kMaxExperts || align < 1 || capacity < 0)
    return cudaErrorInvalidValue;
  const int64_t rows = permute_rows(tokens, top_k, num_experts, align);
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // row ids are int32
  const int64_t entries = tokens * top_k, tiles = permute_tiles(entries);
  int* hist = static_cast<int*>(workspace);
  int* kept = hist + tiles * num_experts;
  if (tiles > 0) {
    MARIN_LAUNCH(static_cast<unsigned>(tiles), kPermuteThreads, stream, permute_rank_kernel)(expert_ids, entries,
                                                                                      num_experts, row_of, hist);
  }
  MARIN_LAUNCH(1, kScanThreads, stream, permute_scan_kernel)(hist, tiles, num_experts, align, capacity, kept, offsets);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t row_bytes = hidden * elem_size;
#define MARIN_SCATTER(V)                                                                                      \
  launch_scatter<V>(x, row_bytes, expert_ids, tokens, top_k, num_experts, capacity, hist, offsets, kept, row_of, \
                    src_of, rows, routed, stream)
  switch (access_bytes(row_bytes, x, routed)) {
    case 16: return MARIN_SCATTER(uint4);
    case 8: return MARIN_SCATTER(uint2);
    case 4: return MARIN_SCATTER(uint32_t);
    case 2: return MARIN_SCATTER(uint16_t);
    default: return MARIN_SCATTER(uint8_t);
  }
#undef MARIN_SCATTER
}
