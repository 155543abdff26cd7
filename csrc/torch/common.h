// Shared by the torch glue: error text, dtype mapping, device checks, and the
// cross-entropy helpers the plain and the fused loss share. The device entry
// points are in kernels.h.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "../kernels/dtype.h"

namespace fastreduce {

// Error-message pieces as std::string. Messages stream only strings: under
// torch 2.11 on the GPU machine, streaming integers into TORCH_CHECK's
// message crashed the process (NOTES.md).
std::string to_text(int64_t value);
std::string to_text(at::IntArrayRef values);
std::string to_text(at::ScalarType type);

// The accumulator dtype of the row ops' statistics and losses: float64 for
// float64 input, float32 for the rest (float32, float16, bfloat16).
at::ScalarType acc_type(const at::Tensor& input);
std::string to_text(const at::Device& device);

// t on reference's device, or an error naming both arguments (before any
// kernel touches their memory).
void check_same_device(const at::Tensor& t, const at::Tensor& reference, const char* op, const char* argument,
                       const char* reference_name);

// dim wrapped into [0, ndim) (a 0-d tensor takes -1 and 0), IndexError
// otherwise, with torch's message.
int64_t wrap_dim(int64_t dim, int64_t ndim);

// t in dtype `type`: t itself when it already is (Tensor::to goes through
// the dispatcher even then).
inline at::Tensor in_type(const at::Tensor& t, at::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

// An uninitialised tensor of the contiguous t's shape and options (one
// dispatch; empty_like takes two, through empty_strided).
inline at::Tensor empty_as(const at::Tensor& t) { return at::empty(t.sizes(), t.options()); }

// A tensor's data for the kernels' buffer structs: null where it is undefined (absent).
inline const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
inline void* mutable_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Maps the dtypes the kernels support; raises a RuntimeError naming `op` and
// the dtype otherwise.
DType to_dtype(at::ScalarType type, const char* op);

// Each row's loss (accumulator type) from its lse: (1 - eps) (lse - z_target)
// + eps (lse - mean z), 0 on ignored rows, NaN for a target out of range.
at::Tensor cross_entropy_row_losses(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& row_lse,
                                    int64_t ignore_index, double label_smoothing);
// cross_entropy_with_grad_stub on the logits' device (rows contiguous, the
// gradient's laid out as theirs: the same buffer in place); target contiguous;
// `op` names the caller in errors. The gradient is of grad_scale (undefined:
// 1) times the summed row losses, or with `mean` of their mean over the rows
// not ignored. Each row's lse and loss go to `lse` and `row_loss`
// (accumulator type), their sum or mean to `loss` (0-d, the logits' dtype);
// any of the three may be undefined.
void cross_entropy_with_grad_rows(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& grad_scale,
                                  bool mean, const at::Tensor& lse, const at::Tensor& row_loss, const at::Tensor& loss,
                                  at::Tensor& grad_input, int64_t ignore_index, double label_smoothing,
                                  const char* op);

// cross_entropy_backward into a given (N, C) buffer of the logits' dtype
// whose rows are contiguous: the logits themselves (in place), or rows
// laid out as theirs, or contiguous.
void cross_entropy_backward_into(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                 const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                 c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                 at::Tensor& grad_input);

}  // namespace fastreduce
