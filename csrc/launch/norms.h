// Launchers for layer_norm and softmax: contiguous (rows, n) buffers, raw
// pointers, a stream, no torch. Statistics (mean, rstd) and weight/bias
// gradients are in the accumulator type: float, or double for double input.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

// weight and bias may be null.
cudaError_t layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, void* y,
                               void* mean, void* rstd, int64_t rows, int64_t n, double eps, cudaStream_t stream);

size_t layer_norm_backward_workspace_bytes(DType dtype, int64_t rows, int64_t n, int sm_count);

// dx always; dweight and dbias (accumulator type, n each) when not null.
cudaError_t layer_norm_backward(DType dtype, const void* dy, const void* x, const void* mean, const void* rstd,
                                const void* weight, void* dx, void* dweight, void* dbias, int64_t rows, int64_t n,
                                void* workspace, int sm_count, cudaStream_t stream);

// Softmax of scale * x over rows of n; with causal = T > 0 row r keeps its
// first r % T + 1 entries and zeros the rest (GPT-2 attention).
cudaError_t softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t n, int64_t causal,
                            double scale, cudaStream_t stream);

cudaError_t softmax_backward(DType dtype, const void* dy, const void* y, void* dx, int64_t rows, int64_t n,
                             int64_t causal, double scale, cudaStream_t stream);

}  // namespace fastreduce
