#include "../launch/cross_entropy.h"
#include "../launch/scale.h"
#include "common.h"
#include "cuda_utils.h"
#include "kernels.h"

namespace fastreduce {
namespace {

CrossEntropyShape shape_of(const at::Tensor& logits, const CrossEntropyArgs& args, const char* op) {
  return {to_dtype(logits.scalar_type(), op), args.rows, args.classes, args.ignore_index, args.label_smoothing,
          args.reduction};
}

void cross_entropy_forward_cuda(const at::Tensor& logits, const at::Tensor& target, at::Tensor& loss,
                                at::Tensor& lse, const CrossEntropyArgs& args) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const CrossEntropyShape shape = shape_of(logits, args, "cross_entropy");
  at::Tensor scratch = workspace(logits, cross_entropy_workspace_bytes(shape));
  check_cuda(cross_entropy_forward(shape, logits.const_data_ptr(), target.const_data_ptr<int64_t>(), loss.data_ptr(),
                                   lse.data_ptr(), scratch.data_ptr(), current_stream()),
             "cross_entropy");
}

void cross_entropy_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& grad_lse, const at::Tensor& logits,
                                 const at::Tensor& target, const at::Tensor& lse, at::Tensor& grad_input,
                                 const CrossEntropyArgs& args) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const CrossEntropyShape shape = shape_of(logits, args, "cross_entropy_backward");
  at::Tensor scratch = workspace(logits, cross_entropy_workspace_bytes(shape));
  check_cuda(cross_entropy_backward(shape, grad_loss.const_data_ptr(),
                                    grad_lse.defined() ? grad_lse.const_data_ptr() : nullptr,
                                    logits.const_data_ptr(), target.const_data_ptr<int64_t>(), lse.const_data_ptr(),
                                    grad_input.data_ptr(), scratch.data_ptr(), current_stream()),
             "cross_entropy_backward");
}

void cross_entropy_forward_backward_cuda(const at::Tensor& logits, const at::Tensor& target,
                                         const at::Tensor& grad_scale, at::Tensor& lse, at::Tensor& row_loss,
                                         at::Tensor& grad_input, const CrossEntropyArgs& args) {
  const c10::cuda::CUDAGuard guard(logits.device());
  check_cuda(cross_entropy_forward_backward(shape_of(logits, args, "cross_entropy"), logits.const_data_ptr(),
                                            target.const_data_ptr<int64_t>(),
                                            grad_scale.defined() ? grad_scale.const_data_ptr() : nullptr,
                                            lse.data_ptr(), row_loss.data_ptr(), grad_input.data_ptr(),
                                            current_stream()),
             "cross_entropy");
}

void scale_unless_one_cuda(at::Tensor& data, const at::Tensor& factor) {
  const c10::cuda::CUDAGuard guard(data.device());
  check_cuda(scale_unless_one(to_dtype(data.scalar_type(), "_scale_unless_one_"), data.data_ptr(), data.numel(),
                              factor.const_data_ptr(), sm_count(), current_stream()),
             "_scale_unless_one_");
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(cross_entropy_forward_stub, CUDA, cross_entropy_forward_cuda);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_backward_stub, CUDA, cross_entropy_backward_cuda);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_with_grad_stub, CUDA, cross_entropy_forward_backward_cuda);
FASTREDUCE_REGISTER_KERNEL(scale_unless_one_stub, CUDA, scale_unless_one_cuda);

}  // namespace fastreduce
