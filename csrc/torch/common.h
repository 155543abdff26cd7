// Shared by the torch glue: dtype mapping and the backend entry points that
// the device-independent op code calls.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "../kernels/reduce_op.h"
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

// Maps the dtypes the kernels support; raises a RuntimeError naming `op` and
// the dtype otherwise.
DType to_dtype(at::ScalarType type, const char* op);

// Reduces the dense (outer, len, inner) view `input` over len into the dense
// `out` (outer * inner elements of the op's output type) and, for the kinds
// with two results, `second` (the mean of var_mean, the max of aminmax).
void reduce_cpu(ReduceKind kind, const ReduceParams& params, const at::Tensor& input, int64_t outer, int64_t len,
                int64_t inner, at::Tensor& out, at::Tensor* second = nullptr);
void reduce_cuda(ReduceKind kind, const ReduceParams& params, const at::Tensor& input, int64_t outer, int64_t len,
                 int64_t inner, at::Tensor& out, at::Tensor* second = nullptr);

// The norm of each of `tensors` (CUDA, contiguous, float/half types) into
// the 0-dim `norms` (one per tensor, of its dtype), in one pass over all.
void foreach_norm_cuda(at::TensorList tensors, double ord, std::vector<at::Tensor>& norms);

// A row-wise normalisation over contiguous (rows, n) data. causal > 0: the
// GPT-2 softmax over (..., T, T) scores with T = causal. scalar: eps for
// layer_norm, the score scale for softmax.
struct NormArgs {
  int64_t rows, n, causal;
  double scalar;
};

// The tensors of a layer_norm (centered) or rms_norm forward; undefined
// means absent. With `residual`, the rows normalised are x + residual,
// written to residual_out. mean: centered only.
struct NormForwardTensors {
  at::Tensor x, residual, weight, bias, y, residual_out, mean, rstd;
};
// The backward: dx (plus grad_residual when defined) always; dweight, and
// dbias for layer_norm, when defined (each in x's dtype or the accumulator
// type, as the caller allocated it: its parameter's dtype).
struct NormBackwardTensors {
  at::Tensor dy, x, grad_residual, mean, rstd, weight, dx, dweight, dbias;
};
void norm_forward_cpu(NormForwardTensors& t, bool centered, const NormArgs& args);
void norm_forward_cuda(NormForwardTensors& t, bool centered, const NormArgs& args);
void norm_backward_cpu(NormBackwardTensors& t, bool centered, const NormArgs& args);
void norm_backward_cuda(NormBackwardTensors& t, bool centered, const NormArgs& args);
// The apply half of a norm from given row statistics (split_norm.cpp);
// mean undefined: rms_norm. Contiguous (rows, n), parameters in x's dtype.
struct NormApplyTensors {
  at::Tensor x, mean, rstd, weight, bias, y;
};
void normalize_rows_cuda(NormApplyTensors& t, int64_t rows, int64_t n);
void softmax_forward_cpu(const at::Tensor& x, at::Tensor& y, const NormArgs& args);
void softmax_forward_cuda(const at::Tensor& x, at::Tensor& y, const NormArgs& args);
void softmax_backward_cpu(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args);
void softmax_backward_cuda(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args);

// Sums the contiguous 1-D CUDA tensor `flat` with ladder rung `rung` into `out`.
// Cross-entropy over contiguous (rows, classes) logits with int64 targets:
// loss (rows elements for reduction none, else one) in the logits' dtype,
// lse (rows) in the accumulator type. grad_lse may be undefined.
struct CrossEntropyArgs {
  int64_t rows, classes, ignore_index;
  double label_smoothing;
  int reduction;  // 0 none, 1 mean, 2 sum
};
void cross_entropy_forward_cpu(const at::Tensor& logits, const at::Tensor& target, at::Tensor& loss, at::Tensor& lse,
                               const CrossEntropyArgs& args);
void cross_entropy_forward_cuda(const at::Tensor& logits, const at::Tensor& target, at::Tensor& loss,
                                at::Tensor& lse, const CrossEntropyArgs& args);
void cross_entropy_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& logits,
                                const at::Tensor& target, const at::Tensor& lse, at::Tensor& grad_input,
                                const CrossEntropyArgs& args);
void cross_entropy_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& logits,
                                 const at::Tensor& target, const at::Tensor& lse, at::Tensor& grad_input,
                                 const CrossEntropyArgs& args);

// lse and row losses (accumulator type, rows each) and the gradient of
// grad_scale (a 0-d accumulator-type tensor, or undefined for 1) times their
// sum, in one kernel; grad_input may be the logits.
void cross_entropy_forward_backward_cuda(const at::Tensor& logits, const at::Tensor& target,
                                         const at::Tensor& grad_scale, at::Tensor& lse, at::Tensor& row_loss,
                                         at::Tensor& grad_input, const CrossEntropyArgs& args);
// Each row's loss (accumulator type) from its lse: (1 - eps) (lse - z_target)
// + eps (lse - mean z), 0 on ignored rows, NaN for a target out of range.
at::Tensor cross_entropy_row_losses(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& row_lse,
                                    int64_t ignore_index, double label_smoothing);
// cross_entropy_forward_backward_cuda on either device (the CPU in three
// passes); target contiguous.
void cross_entropy_with_grad_rows(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& grad_scale,
                                  at::Tensor& lse, at::Tensor& row_loss, at::Tensor& grad_input,
                                  int64_t ignore_index, double label_smoothing);

// data (contiguous) *= factor (0-d, data's accumulator type, same device)
// unless the factor is 1; no host synchronisation on CUDA.
void scale_unless_one_cuda(at::Tensor& data, const at::Tensor& factor);

// cross_entropy_backward into a given (N, C) buffer of the logits' dtype,
// which may be the logits themselves when they are contiguous (in place).
void cross_entropy_backward_into(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                 const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                 c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                 at::Tensor& grad_input);

void ladder_cuda(int rung, const at::Tensor& flat, at::Tensor& out);
void read_probe_cuda(const at::Tensor& data, at::Tensor& flag);

}  // namespace fastreduce
