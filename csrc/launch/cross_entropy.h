// Launchers for the fused cross-entropy: contiguous (rows, classes) logits,
// int64 targets, raw pointers, a stream, no torch. lse, row losses and the
// lse gradient are in the accumulator type (float, double for double).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

struct CrossEntropyShape {
  DType dtype;
  int64_t rows, classes, ignore_index;
  double label_smoothing;
  int reduction;  // 0 none, 1 mean, 2 sum (LossReduction)
};

// Scratch for either pass: the per-row losses.
size_t cross_entropy_workspace_bytes(const CrossEntropyShape& shape);

// loss: rows elements of the logits' dtype (none) or one; lse: rows.
cudaError_t cross_entropy_forward(const CrossEntropyShape& shape, const void* logits, const int64_t* target,
                                  void* loss, void* lse, void* workspace, cudaStream_t stream);

// grad_loss: as `loss`; grad_lse may be null.
cudaError_t cross_entropy_backward(const CrossEntropyShape& shape, const void* grad_loss, const void* grad_lse,
                                   const void* logits, const int64_t* target, const void* lse, void* grad_input,
                                   void* workspace, cudaStream_t stream);

// The forward's lse and row losses (no reduction) and the gradient of
// *grad_scale times the summed row losses (grad_scale: a device value of the
// accumulator type, or null for 1), in one kernel; grad_input may be the
// logits (in place).
cudaError_t cross_entropy_forward_backward(const CrossEntropyShape& shape, const void* logits, const int64_t* target,
                                           const void* grad_scale, void* lse, void* row_loss, void* grad_input,
                                           cudaStream_t stream);

}  // namespace fastreduce
