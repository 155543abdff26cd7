// Launchers for layer_norm and rms_norm, each optionally fused with the
// pre-norm residual add: contiguous (rows, n) buffers, raw pointers, a
// stream, no torch. Statistics (mean, rstd) are in the accumulator type:
// float, or double for double input.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

// The shape of a normalisation: `centered` subtracts the row mean
// (layer_norm); otherwise it is rms_norm (no mean, no bias).
struct NormShape {
  DType dtype;
  int64_t rows, n;
  bool centered;
};

// Null pointers are absent. With `residual`, the rows normalised are
// h = x + residual, written to `residual_out`. `mean`: centered only.
struct NormForward {
  const void* x;
  const void* residual;
  const void* weight;
  const void* bias;
  void* y;
  void* residual_out;
  void* mean;
  void* rstd;
  double eps;
};
cudaError_t norm_forward(const NormShape& shape, const NormForward& io, cudaStream_t stream);

// dx always, plus grad_residual when given (it is then the gradient of both
// inputs of the add); dweight, dbias (n each) when not null, each in the
// input's dtype where its flag says so (half parameters beside half input),
// else in the accumulator type.
struct NormBackward {
  const void* dy;
  const void* x;  // the normalised rows (h for the fused add)
  const void* grad_residual;
  const void* mean;
  const void* rstd;
  const void* weight;
  void* dx;
  void* dweight;
  void* dbias;
  bool dweight_in_input_type;
  bool dbias_in_input_type;
};
// The apply half of a norm from given row statistics (mean null: rms_norm):
// y = (x - mean) * rstd * weight + bias. Statistics in the accumulator type.
struct NormApply {
  const void* x;
  const void* mean;
  const void* rstd;
  const void* weight;
  const void* bias;
  void* y;
};
cudaError_t normalize_rows(const NormShape& shape, const NormApply& io, int sm_count, cudaStream_t stream);

size_t norm_backward_workspace_bytes(const NormShape& shape, int sm_count);
cudaError_t norm_backward(const NormShape& shape, const NormBackward& io, void* workspace, int sm_count,
                          cudaStream_t stream);

}  // namespace fastreduce
