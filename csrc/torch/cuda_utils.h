// Helpers for the CUDA glue: error checks, SM count, workspace. Only c10's
// CUDA headers: ATen/cuda/CUDAContext.h pulls in cuSPARSE and cuBLAS headers
// that a minimal toolkit lacks.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace fastreduce {

inline void check_cuda(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA error: ", cudaGetErrorString(err));
}

// Multiprocessors of the current device, read once per device.
int sm_count();

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Scratch memory from the caching allocator on the current stream: no
// cudaMalloc, safe under CUDA-graph capture. None (undefined) for 0 bytes.
inline at::Tensor workspace(const at::Tensor& like, size_t bytes) {
  return bytes ? at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte)) : at::Tensor();
}
// The same on the current device.
inline at::Tensor workspace(size_t bytes) {
  const auto options = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, c10::cuda::current_device());
  return bytes ? at::empty({static_cast<int64_t>(bytes)}, options) : at::Tensor();
}

}  // namespace fastreduce
