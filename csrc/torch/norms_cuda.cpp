#include "../launch/norms.h"
#include "common.h"
#include "cuda_utils.h"

namespace fastreduce {
namespace {

const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

// Statistics travel in the accumulator type.
at::Tensor as_acc(const at::Tensor& t, const at::Tensor& like) {
  return t.to(like.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).contiguous();
}

}  // namespace

void layer_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y,
                             at::Tensor& mean, at::Tensor& rstd, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_cuda(layer_norm_forward(to_dtype(x.scalar_type(), "layer_norm"), x.const_data_ptr(), data_or_null(weight),
                                data_or_null(bias), y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), args.rows, args.n,
                                args.scalar, current_stream()),
             "layer_norm");
}

void layer_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
                              const at::Tensor& rstd, const at::Tensor& weight, at::Tensor& dx, at::Tensor* dweight,
                              at::Tensor* dbias, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(x.device());
  const DType dtype = to_dtype(x.scalar_type(), "layer_norm_backward");
  const at::Tensor mean_acc = as_acc(mean, x), rstd_acc = as_acc(rstd, x);
  const size_t bytes = dweight ? layer_norm_backward_workspace_bytes(dtype, args.rows, args.n, sm_count()) : 0;
  at::Tensor scratch = workspace(x, bytes);
  check_cuda(layer_norm_backward(dtype, dy.const_data_ptr(), x.const_data_ptr(), mean_acc.const_data_ptr(),
                                 rstd_acc.const_data_ptr(), data_or_null(weight), dx.data_ptr(),
                                 dweight ? dweight->data_ptr() : nullptr, dbias ? dbias->data_ptr() : nullptr,
                                 args.rows, args.n, bytes ? scratch.data_ptr() : nullptr, sm_count(),
                                 current_stream()),
             "layer_norm_backward");
}

void softmax_forward_cuda(const at::Tensor& x, at::Tensor& y, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_cuda(softmax_forward(to_dtype(x.scalar_type(), "softmax"), x.const_data_ptr(), y.data_ptr(), args.rows,
                             args.n, args.causal, args.scalar, current_stream()),
             "softmax");
}

void softmax_backward_cuda(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(y.device());
  check_cuda(softmax_backward(to_dtype(y.scalar_type(), "softmax_backward"), dy.const_data_ptr(), y.const_data_ptr(),
                              dx.data_ptr(), args.rows, args.n, args.causal, args.scalar, current_stream()),
             "softmax_backward");
}

}  // namespace fastreduce
