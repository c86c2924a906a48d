// The C ABI of libmarin_kernels.so: what marin_model/cuda/dispatch.py calls through ctypes (docs/cuda.md).
//
// Every launcher takes raw device pointers, sizes and the stream to launch on, launches asynchronously and
// returns the cudaError_t of its launches (as int; 0 = success). Nothing is allocated and nothing is
// synchronised, so the launchers can be captured in a CUDA graph. Outputs are written in full (no memset
// is expected of the caller), except the unused rows of routed and grad_routed (past offsets[E]), which
// nothing reads. Element types: 0 = fp32, 1 = bf16, 2 = fp16 (marin::DType).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a signature below or what an output holds changes; marin_model/cuda/library.py refuses
// a library with another number.
#define MARIN_KERNELS_ABI_VERSION 3
int marin_kernels_abi_version(void);
const char* marin_cuda_error_string(int error);

// The CUDA runtime version this library was built with and the driver's (0 without a driver), as
// 1000 * major + 10 * minor. The runtime is linked statically: it needs a driver of its major or newer.
void marin_cuda_versions(int* runtime, int* driver);

// Occupancy of the kernel at `index` (0, 1, ...): its name, threads per block and resident blocks per
// multiprocessor on the current GPU (-1 without one). cudaErrorInvalidValue past the last kernel.
int marin_kernel_occupancy(int index, const char** name, int* threads, int* blocks_per_sm);

// route_topk: logits [T,E] (dtype), bias [E] fp32 or NULL -> expert_ids [T,k] int32, weights [T,k] fp32,
// counts [E] int32, lse [T] fp32. mode: 0 sigmoid, 1 softmax_topk, 2 topk_softmax. E <= 512, k <= 16.
int marin_route_topk(const void* logits, int dtype, const float* bias, int64_t tokens, int num_experts, int k,
                     int mode, float scale, int renormalize, int n_group, int topk_group, int* expert_ids,
                     float* weights, int* counts, float* lse, cudaStream_t stream);

// route_topk_backward: grad_weights [T,k] fp32, grad_lse [T] fp32 -> grad_logits [T,E] (logits' dtype).
int marin_route_topk_backward(const float* grad_weights, const float* grad_lse, const void* logits, int dtype,
                              const int* expert_ids, int64_t tokens, int num_experts, int k, int mode,
                              float scale, int renormalize, void* grad_logits, cudaStream_t stream);

// permute scratch: bytes of the `workspace` argument of marin_permute.
size_t marin_permute_workspace_bytes(int64_t tokens, int top_k, int num_experts);

// permute: x [T,H] of elem_size-byte elements, expert_ids [T,K] int32 -> routed [R,H], row_of [T,K] int32,
// src_of [R] int32, offsets [E+1] int32 with R = T*K + E*(align-1). E <= 512, K <= 16. Padding rows inside
// a group are zero with src_of -1; the unused rows past offsets[E] have src_of -2 and are not written.
int marin_permute(const void* x, int64_t tokens, int64_t hidden, int elem_size, const int* expert_ids, int top_k,
                  int num_experts, int align, int capacity, void* routed, int* row_of, int* src_of, int* offsets,
                  void* workspace, cudaStream_t stream);

// unpermute: routed [R,H] (dtype), row_of [T,K], weights [T,K] fp32 or NULL (= 1) -> out [T,H] (dtype).
// Entries of row_of outside [0, R) count as dropped.
int marin_unpermute(const void* routed, int dtype, int64_t rows, int64_t hidden, const int* row_of, int64_t tokens,
                    int top_k, const float* weights, void* out, cudaStream_t stream);

// unpermute_backward: grad_out [T,H] (grad_dtype: dtype or fp32) -> grad_routed [R,H] (dtype) and, when
// grad_weights is not NULL (needs weights), grad_weights [T,K] fp32. row_of and src_of must come from one
// permute call; grad_routed rows with src_of -1 are zeroed, those with src_of -2 are not written.
int marin_unpermute_backward(const void* grad_out, int grad_dtype, const void* routed, int dtype, int64_t rows,
                             int64_t hidden, const int* row_of, const int* src_of, int64_t tokens, int top_k,
                             const float* weights, void* grad_routed, float* grad_weights, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
