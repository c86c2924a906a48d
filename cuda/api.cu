// Library-level entry points: the ABI version, error strings, versions and occupancy (see marin_kernels.h).
#include "device.cuh"
#include "marin_kernels.h"

extern "C" int marin_kernels_abi_version(void) { return MARIN_KERNELS_ABI_VERSION; }

extern "C" const char* marin_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

extern "C" void marin_cuda_versions(int* runtime, int* driver) {
  *runtime = CUDART_VERSION;
  if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
}

extern "C" int marin_kernel_occupancy(int index, const char** name, int* threads, int* blocks_per_sm) {
  static marin::Occupancy table[3 * marin::kMaxOccupancyEntries];
  static int count = -1;
  if (count < 0) {
    count = marin::route_topk_occupancy(table);
    count += marin::permute_occupancy(table + count);
    count += marin::unpermute_occupancy(table + count);
  }
  if (index < 0 || index >= count) return cudaErrorInvalidValue;
  *name = table[index].name;
  *threads = table[index].threads;
  *blocks_per_sm = table[index].blocks;
  return cudaSuccess;
}
