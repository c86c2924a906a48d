// Kernels that check the emulation itself (tests/test_cuda_emulated.py): failures it must report, barriers
// that exited threads leave, the 16-bit conversions. Host build only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

// case 0: lane 0 waits at __syncthreads while its warp waits for it in a shuffle: a deadlock.
// case 1: lane 0 returns, the rest of its warp shuffles with a full mask: undefined on the device.
// case 2: the upper half of the block returns; the lower half meets at __syncthreads and sums shared memory
//         into out[block].
// case 3, 4, 5: counts of the threads of the block (in shared memory) and of the blocks (out[0], by thread 0
// of each), with atomicAdd (3); with a plain += in shared memory (4) or across the blocks (5), a lost update
// on a GPU: the results are right here, and the "tsan" build reports the race.
__global__ void selftest_kernel(int which, int* out) {
  __shared__ int values[128];
  __shared__ int count;
  const int t = threadIdx.x;
  if (which == 0) {
    if (t == 0) __syncthreads();
    else out[t] = __shfl_xor_sync(0xffffffffu, t, 1);
    return;
  }
  if (which == 1) {
    if (t == 0) return;
    out[t] = __shfl_xor_sync(0xffffffffu, t, 1);
    return;
  }
  if (which >= 3) {
    if (t == 0) count = 0;
    __syncthreads();
    if (which == 4) count += 1;
    else atomicAdd(&count, 1);
    __syncthreads();
    if (t == 0 && which == 5) out[0] += count;
    else if (t == 0) atomicAdd(&out[0], count);
    return;
  }
  if (t >= 64) return;
  values[t] = t;
  __syncthreads();
  if (t == 0) {
    int sum = 0;
    for (int i = 0; i < 64; ++i) sum += values[i];
    out[blockIdx.x] = sum;
  }
}

}  // namespace

extern "C" int emu_selftest(int which, int* out) {
  MARIN_LAUNCH(2, 128, nullptr, selftest_kernel)(which, out);
  return cudaGetLastError();
}

extern "C" void emu_to_bf16(const float* in, unsigned short* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]).__x;
}

extern "C" void emu_to_half(const float* in, unsigned short* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __float2half_rn(in[i]).__x;
}

extern "C" void emu_from_half(const unsigned short* in, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = __half2float(__half{in[i]});
}
