// A small CUDA execution model for the host, so that the kernels of cuda/*.cu compile with g++ and run on
// the CPU from the very same lines (tests/test_cuda_emulated.py, scripts/mutate_kernels.py).
//
// - A launch runs its blocks one after another; the threads of a block run as fibers (emu.cpp switches
//   stacks by hand), each until it blocks at __syncthreads() or a warp collective, then the next runnable
//   fiber, picked at random from a seeded generator, so a missing barrier shows up as a wrong result.
// - __syncthreads() waits for every live thread of the block (threads that returned leave it); warp
//   collectives (__shfl_*_sync, __ballot_sync, __match_any_sync, __reduce_*_sync, __syncwarp) wait for every
//   lane of their mask and then give each lane the lock-step answer. A lane that exits while named in a
//   waiting mask, different masks in one collective, or a block that cannot progress is reported as a
//   launch failure (cudaErrorLaunchFailure, with a message from cudaGetErrorString), never a hang.
// - __shared__ variables are static storage (thread-local: the library's TLS segment), overwritten with a
//   garbage byte pattern before each block. Atomics are real (relaxed) atomic operations: the "tsan" build
//   (ThreadSanitizer, emu.cpp) reports a plain read-modify-write that threads race on, as a lost update.
// - __nv_bfloat16 and __half hold their bits and convert with the device's round-to-nearest-even (a NaN
//   becomes the canonical 0x7FFF, as on the GPU). Build with -ffp-contract=off: __fmul_rn and __fadd_rn are
//   plain * and +. expf/logf are the host's (the device's differ in the last bits; docs/cuda.md).
// - The multiprocessor count is small ($CUDA_EMU_SMS, default 2) and one block of any kernel fits on one
//   ($CUDA_EMU_RESIDENT_BLOCKS), so a persistent grid is 2 blocks and its grid-stride loops go round.
// - cuda_emu_last_kernel_offset() names the kernel of the latest launch, template arguments included (the
//   access width a launcher chose, say), as its offset in the library.
// - Launches go through MARIN_LAUNCH(grid, block, stream, kernel)(args...), which nvcc spells <<<>>>.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

// ------------------------------------------------------------------------------------------- keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Thread-local statics: the library's TLS segment then holds exactly the __shared__ variables, which emu.cpp
// finds and overwrites before each block (a named section would not do: g++ ignores it for templates).
#define __shared__ static thread_local

// ---------------------------------------------------------------------------------------- vector types
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };

// --------------------------------------------------------------------------------------- runtime API
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorLaunchFailure = 719,
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
typedef struct CUstream_st* cudaStream_t;

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
namespace cuda_emu {
int env_int(const char* name, int fallback);
}
// The emulation has no registers: it answers one resident block per multiprocessor, the smallest grid a
// launcher sizes by occupancy, whose grid-stride loops then go round most often; CUDA_EMU_RESIDENT_BLOCKS
// says otherwise (tests set it to reach the code that sizes a grid from it; a negative value fails the call).
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
  const int resident = cuda_emu::env_int("CUDA_EMU_RESIDENT_BLOCKS", 1);
  if (resident < 0) return cudaErrorInvalidValue;
  *blocks = resident;
  return cudaSuccess;
}
#define CUDART_VERSION 13000

namespace cuda_emu {

// The running thread's coordinates (updated by the scheduler at each switch).
struct ThreadState {
  uint3 thread_idx;
  int tid;  // linear index in the block
};
extern ThreadState* current;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

void block_barrier();
// Each lane of `mask` deposits `bits`; once all have, every lane gets all deposits (and the mask).
// `orders_memory`: the lanes' memory accesses before it happen before theirs after it (__syncwarp's
// guarantee, which shuffles, votes and reductions do not give; it matters to the "tsan" build).
const uint64_t* warp_exchange(unsigned mask, uint64_t bits, const char* what, bool orders_memory = false);
void fail(const char* message);
void run_grid(const void* kernel, dim3 grid, dim3 block, void (*body)(void*), void* context);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp values are at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename T>
T from_bits(uint64_t bits) {
  T v;
  memcpy(&v, &bits, sizeof(T));
  return v;
}

inline int lane_id() { return current->tid % 32; }

template <typename T>
T shuffle_from(unsigned mask, T v, int src, const char* what) {
  const uint64_t* slots = warp_exchange(mask, to_bits(v), what);
  if (!((mask >> src) & 1u)) fail("a shuffle read a lane outside its mask (undefined on the device)");
  return from_bits<T>(slots[src]);
}

// CUDA's launch, for MARIN_LAUNCH: converts the arguments to the kernel's parameter types, then runs it.
template <typename... Params>
struct Launch {
  dim3 grid, block;
  void (*kernel)(Params...);

  template <typename... Args>
  void operator()(Args&&... args) const {
    using Tuple = std::tuple<std::decay_t<Params>...>;
    struct Context {
      void (*kernel)(Params...);
      Tuple params;
    } context{kernel, Tuple(std::forward<Args>(args)...)};
    run_grid(reinterpret_cast<const void*>(kernel), grid, block, [](void* raw) {
      auto* c = static_cast<Context*>(raw);
      std::apply(c->kernel, c->params);
    }, &context);
  }
};

template <typename... Params>
Launch<Params...> launch(dim3 grid, dim3 block, cudaStream_t, void (*kernel)(Params...)) {
  return Launch<Params...>{grid, block, kernel};
}

}  // namespace cuda_emu

#define MARIN_LAUNCH(grid, block, stream, ...) ::cuda_emu::launch((grid), (block), (stream), __VA_ARGS__)

#define threadIdx (::cuda_emu::current->thread_idx)
#define blockIdx (::cuda_emu::block_idx)
#define blockDim (::cuda_emu::block_dim)
#define gridDim (::cuda_emu::grid_dim)
#define warpSize 32

// ----------------------------------------------------------------------------------------- intrinsics
inline void __syncthreads() { cuda_emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_emu::warp_exchange(mask, 0, "__syncwarp", true); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = cuda_emu::lane_id();
  return cuda_emu::shuffle_from(mask, v, (lane & ~(width - 1)) + (src & (width - 1)), "__shfl_sync");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = cuda_emu::lane_id();
  const int src = lane ^ lane_mask;
  return cuda_emu::shuffle_from(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane,
                                "__shfl_xor_sync");
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = cuda_emu::lane_id();
  const int src = (lane % width) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return cuda_emu::shuffle_from(mask, v, src, "__shfl_up_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = cuda_emu::lane_id();
  const int src = (lane % width) + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return cuda_emu::shuffle_from(mask, v, src, "__shfl_down_sync");
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* slots = cuda_emu::warp_exchange(mask, predicate != 0, "__ballot_sync");
  unsigned out = 0;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && slots[l]) out |= 1u << l;
  return out;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == mask; }

template <typename T>
unsigned __match_any_sync(unsigned mask, T v) {
  const uint64_t* slots = cuda_emu::warp_exchange(mask, cuda_emu::to_bits(v), "__match_any_sync");
  const uint64_t mine = slots[cuda_emu::lane_id()];
  unsigned out = 0;
  for (int l = 0; l < 32; ++l)
    if (((mask >> l) & 1u) && slots[l] == mine) out |= 1u << l;
  return out;
}

namespace cuda_emu {
template <typename T, typename Op>
T warp_reduce(unsigned mask, T v, Op op, const char* what) {
  const uint64_t* slots = warp_exchange(mask, to_bits(v), what);
  bool first = true;
  T acc{};
  for (int l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    const T x = from_bits<T>(slots[l]);
    acc = first ? x : op(acc, x);
    first = false;
  }
  return acc;
}
}  // namespace cuda_emu

inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a > b ? a : b; }, "__reduce_max_sync");
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return cuda_emu::warp_reduce(mask, v, [](int a, int b) { return a > b ? a : b; }, "__reduce_max_sync");
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a < b ? a : b; }, "__reduce_min_sync");
}
inline int __reduce_min_sync(unsigned mask, int v) {
  return cuda_emu::warp_reduce(mask, v, [](int a, int b) { return a < b ? a : b; }, "__reduce_min_sync");
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a + b; }, "__reduce_add_sync");
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return static_cast<int>(__reduce_add_sync(mask, static_cast<unsigned>(v)));
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a | b; }, "__reduce_or_sync");
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) {
  return cuda_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a & b; }, "__reduce_and_sync");
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline unsigned __brev(unsigned v) {
  unsigned out = 0;
  for (int i = 0; i < 32; ++i) out |= ((v >> i) & 1u) << (31 - i);
  return out;
}
inline unsigned __activemask() { return 0xffffffffu; }

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline unsigned __float_as_uint(float v) { return cuda_emu::from_bits<unsigned>(cuda_emu::to_bits(v)); }
inline float __uint_as_float(unsigned v) { return cuda_emu::from_bits<float>(cuda_emu::to_bits(v)); }
inline int __float_as_int(float v) { return cuda_emu::from_bits<int>(cuda_emu::to_bits(v)); }
inline float __int_as_float(int v) { return cuda_emu::from_bits<float>(cuda_emu::to_bits(v)); }
template <typename T>
T __ldg(const T* p) { return *p; }

// Real atomic operations (relaxed, as CUDA's), so that the ThreadSanitizer build (emu.cpp) tells them from a
// plain read-modify-write, which it reports when two threads race on it.
namespace cuda_emu {
template <typename T, typename Op>
T atomic_update(T* address, Op op) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  T desired = op(old);
  while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    desired = op(old);
  return old;
}
}  // namespace cuda_emu

template <typename T>
T atomicAdd(T* address, T v) {
  return cuda_emu::atomic_update(address, [v](T old) { return old + v; });
}
template <typename T>
T atomicMax(T* address, T v) {
  return cuda_emu::atomic_update(address, [v](T old) { return old > v ? old : v; });
}
template <typename T>
T atomicMin(T* address, T v) {
  return cuda_emu::atomic_update(address, [v](T old) { return old < v ? old : v; });
}
template <typename T>
T atomicExch(T* address, T v) {
  T old;
  __atomic_exchange(address, &v, &old, __ATOMIC_RELAXED);
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T v) {
  __atomic_compare_exchange(address, &compare, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;  // the old value, whether or not it was replaced
}

// ------------------------------------------------------------------------------------ 16-bit floats
struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
};
struct alignas(2) __half {
  unsigned short __x;
};

inline float __bfloat162float(__nv_bfloat16 v) { return __uint_as_float(static_cast<unsigned>(v.__x) << 16); }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned u = __float_as_uint(f);
  if (f != f) return __nv_bfloat16{0x7fff};
  return __nv_bfloat16{static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline float __half2float(__half v) {
  const unsigned sign = (v.__x & 0x8000u) << 16, exp = (v.__x >> 10) & 0x1fu, mant = v.__x & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline __half __float2half_rn(float f) {
  const unsigned u = __float_as_uint(f);
  const unsigned short sign = static_cast<unsigned short>((u >> 16) & 0x8000u);
  if (f != f) return __half{0x7fff};
  const float a = fabsf(f);
  if (a >= 65520.0f) return __half{static_cast<unsigned short>(sign | 0x7c00u)};  // rounds to inf
  if (a < 6.103515625e-05f) {  // subnormal in fp16: a multiple of 2^-24, rounded to nearest even
    const float scaled = a * 16777216.0f;  // exact: a power of two
    return __half{static_cast<unsigned short>(sign | static_cast<unsigned>(nearbyintf(scaled)))};
  }
  const unsigned au = __float_as_uint(a);
  const unsigned rounded = au + 0xfffu + ((au >> 13) & 1u);  // round to 10 mantissa bits, ties to even
  return __half{static_cast<unsigned short>(sign | (((rounded >> 13) - (112u << 10)) & 0x7fffu))};
}
