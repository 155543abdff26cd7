// Launchers for softmax: contiguous (rows, n) buffers, raw pointers, a
// stream, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

// Softmax of scale * x over rows of n; with causal = T > 0 row r keeps its
// first r % T + 1 entries and zeros the rest (GPT-2 attention).
cudaError_t softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t n, int64_t causal,
                            double scale, cudaStream_t stream);

cudaError_t softmax_backward(DType dtype, const void* dy, const void* y, void* dx, int64_t rows, int64_t n,
                             int64_t causal, double scale, cudaStream_t stream);

}  // namespace fastreduce
