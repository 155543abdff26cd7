#include "../launch/norms.h"
#include "../launch/softmax.h"
#include "common.h"
#include "cuda_utils.h"

namespace fastreduce {
namespace {

const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

// Statistics travel in the accumulator type (float32 statistics beside
// float32 parameters are already so).
at::Tensor as_acc(const at::Tensor& t, const at::Tensor& like) {
  return t.to(acc_type(like)).contiguous();
}

}  // namespace

void norm_forward_cuda(NormForwardTensors& t, bool centered, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(t.x.device());
  const char* op = centered ? "layer_norm" : "rms_norm";
  const NormShape shape{to_dtype(t.x.scalar_type(), op), args.rows, args.n, centered};
  const NormForward io{t.x.const_data_ptr(), data_or_null(t.residual), data_or_null(t.weight), data_or_null(t.bias),
                       t.y.data_ptr(), t.residual_out.defined() ? t.residual_out.data_ptr() : nullptr,
                       t.mean.defined() ? t.mean.data_ptr() : nullptr, t.rstd.data_ptr(), args.scalar};
  check_cuda(norm_forward(shape, io, current_stream()), op);
}

void norm_backward_cuda(NormBackwardTensors& t, bool centered, const NormArgs& args) {
  const c10::cuda::CUDAGuard guard(t.x.device());
  const char* op = centered ? "layer_norm_backward" : "rms_norm_backward";
  const NormShape shape{to_dtype(t.x.scalar_type(), op), args.rows, args.n, centered};
  const at::Tensor mean_acc = t.mean.defined() ? as_acc(t.mean, t.x) : at::Tensor(), rstd_acc = as_acc(t.rstd, t.x);
  const size_t bytes = t.dweight.defined() ? norm_backward_workspace_bytes(shape, sm_count()) : 0;
  at::Tensor scratch = workspace(t.x, bytes);
  const NormBackward io{t.dy.const_data_ptr(),
                        t.x.const_data_ptr(),
                        data_or_null(t.grad_residual),
                        data_or_null(mean_acc),
                        rstd_acc.const_data_ptr(),
                        data_or_null(t.weight),
                        t.dx.data_ptr(),
                        t.dweight.defined() ? t.dweight.data_ptr() : nullptr,
                        t.dbias.defined() ? t.dbias.data_ptr() : nullptr,
                        t.dweight.defined() && t.dweight.scalar_type() == t.x.scalar_type(),
                        t.dbias.defined() && t.dbias.scalar_type() == t.x.scalar_type()};
  check_cuda(norm_backward(shape, io, bytes ? scratch.data_ptr() : nullptr, sm_count(), current_stream()), op);
}

void normalize_rows_cuda(NormApplyTensors& t, int64_t rows, int64_t n) {
  const c10::cuda::CUDAGuard guard(t.x.device());
  const char* op = "_normalize_rows";
  const NormShape shape{to_dtype(t.x.scalar_type(), op), rows, n, t.mean.defined()};
  const NormApply io{t.x.const_data_ptr(), data_or_null(t.mean), t.rstd.const_data_ptr(),
                     data_or_null(t.weight), data_or_null(t.bias), t.y.data_ptr()};
  check_cuda(normalize_rows(shape, io, sm_count(), current_stream()), op);
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
