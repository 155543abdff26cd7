// Launchers for the fused cross-entropy: (rows, classes) logits of
// contiguous rows (shape.row_stride apart), int64 targets, raw pointers, a
// stream, no torch. lse, row losses and the
// lse gradient are in the accumulator type (float, double for double).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/cross_entropy_buffers.h"

namespace fastreduce {

// Shape and buffers: cross_entropy_buffers.h.

// Scratch for either pass: the per-row losses.
size_t cross_entropy_workspace_bytes(const CrossEntropyShape& shape);

cudaError_t cross_entropy_forward(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io,
                                  void* workspace, cudaStream_t stream);
cudaError_t cross_entropy_backward(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io,
                                   void* workspace, cudaStream_t stream);
// One kernel, its blocks looping over rows (sm_count: the device's); its
// workspace holds what the blocks fold into io.loss (none without it).
size_t cross_entropy_forward_backward_workspace_bytes(const CrossEntropyShape& shape,
                                                     const CrossEntropyWithGradBuffers& io, int sm_count);
cudaError_t cross_entropy_forward_backward(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io,
                                           void* workspace, int sm_count, cudaStream_t stream);

}  // namespace fastreduce
