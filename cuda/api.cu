// Library-level entry points: the ABI version and error strings (see marin_kernels.h).
#include "marin_kernels.h"

extern "C" int marin_kernels_abi_version(void) { return MARIN_KERNELS_ABI_VERSION; }

extern "C" const char* marin_cuda_error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
