// Launchers for layer_norm and rms_norm, each optionally fused with the
// pre-norm residual add: contiguous (rows, n) buffers, raw pointers, a
// stream, no torch. Statistics (mean, rstd) are in the accumulator type:
// float, or double for double input.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/norm_buffers.h"

namespace fastreduce {

// Buffers and shape: norm_buffers.h.
cudaError_t norm_forward(const NormShape& shape, const NormForwardBuffers<>& io, double eps, cudaStream_t stream);

// The apply half of a norm from given row statistics (mean null: rms_norm).
cudaError_t normalize_rows(const NormShape& shape, const NormApplyBuffers<>& io, int sm_count, cudaStream_t stream);

size_t norm_backward_workspace_bytes(const NormShape& shape, const NormParamGrads& grads, int sm_count);
cudaError_t norm_backward(const NormShape& shape, const NormBackwardBuffers<>& io, const NormParamGrads& grads,
                          void* workspace, int sm_count, cudaStream_t stream);

}  // namespace fastreduce
