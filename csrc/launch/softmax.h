// Launchers for softmax: contiguous (rows, n) buffers, raw pointers, a
// stream, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../kernels/softmax_buffers.h"

namespace fastreduce {

// Shape and buffers: softmax_buffers.h.
cudaError_t softmax_forward(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io, cudaStream_t stream);
cudaError_t softmax_backward(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io, cudaStream_t stream);

}  // namespace fastreduce
