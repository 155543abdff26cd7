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
std::string to_text(const at::Device& device);

// dim wrapped into [0, ndim) (a 0-d tensor takes -1 and 0), IndexError
// otherwise, with torch's message.
int64_t wrap_dim(int64_t dim, int64_t ndim);

// Maps the dtypes the kernels support; raises a RuntimeError naming `op` and
// the dtype otherwise.
DType to_dtype(at::ScalarType type, const char* op);

// Reduces the dense (outer, len, inner) view `input` over len into the dense
// `out` (outer * inner elements of the op's output type).
void reduce_cpu(ReduceKind kind, const at::Tensor& input, int64_t outer, int64_t len, int64_t inner,
                at::Tensor& out);
void reduce_cuda(ReduceKind kind, const at::Tensor& input, int64_t outer, int64_t len, int64_t inner,
                 at::Tensor& out);

// A row-wise normalisation over contiguous (rows, n) data. causal > 0: the
// GPT-2 softmax over (..., T, T) scores with T = causal. scalar: eps for
// layer_norm, the score scale for softmax.
struct NormArgs {
  int64_t rows, n, causal;
  double scalar;
};

// Undefined weight/bias tensors mean none; null dweight/dbias: not wanted.
void layer_norm_forward_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y,
                            at::Tensor& mean, at::Tensor& rstd, const NormArgs& args);
void layer_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y,
                             at::Tensor& mean, at::Tensor& rstd, const NormArgs& args);
void layer_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
                             const at::Tensor& rstd, const at::Tensor& weight, at::Tensor& dx, at::Tensor* dweight,
                             at::Tensor* dbias, const NormArgs& args);
void layer_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
                              const at::Tensor& rstd, const at::Tensor& weight, at::Tensor& dx, at::Tensor* dweight,
                              at::Tensor* dbias, const NormArgs& args);
void softmax_forward_cpu(const at::Tensor& x, at::Tensor& y, const NormArgs& args);
void softmax_forward_cuda(const at::Tensor& x, at::Tensor& y, const NormArgs& args);
void softmax_backward_cpu(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args);
void softmax_backward_cuda(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args);

// Sums the contiguous 1-D CUDA tensor `flat` with ladder rung `rung` into `out`.
void ladder_cuda(int rung, const at::Tensor& flat, at::Tensor& out);
void read_probe_cuda(const at::Tensor& data, at::Tensor& flag);

}  // namespace fastreduce
