// The CUDA kernels of cross-entropy and the gradient's scaling, on the
// current device and stream.
#include "../launch/cross_entropy.h"
#include "../launch/scale.h"
#include "common.h"
#include "cuda_utils.h"
#include "kernels.h"

namespace fastreduce {
namespace {

void cross_entropy_forward_cuda(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io) {
  at::Tensor scratch = workspace(cross_entropy_workspace_bytes(shape));
  check_cuda(cross_entropy_forward(shape, io, scratch.data_ptr(), current_stream()), shape.op);
}

void cross_entropy_backward_cuda(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io) {
  at::Tensor scratch = workspace(cross_entropy_workspace_bytes(shape));
  check_cuda(cross_entropy_backward(shape, io, scratch.data_ptr(), current_stream()), shape.op);
}

void cross_entropy_with_grad_cuda(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io) {
  const int sms = sm_count();
  at::Tensor scratch = workspace(cross_entropy_forward_backward_workspace_bytes(shape, io, sms));
  check_cuda(cross_entropy_forward_backward(shape, io, mutable_or_null(scratch), sms, current_stream()), shape.op);
}

void scale_unless_one_cuda(const ScaleProblem& problem) {
  check_cuda(scale_unless_one(problem, sm_count(), current_stream()), "_scale_unless_one_");
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(cross_entropy_forward_stub, CUDA, cross_entropy_forward_cuda);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_backward_stub, CUDA, cross_entropy_backward_cuda);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_with_grad_stub, CUDA, cross_entropy_with_grad_cuda);
FASTREDUCE_REGISTER_KERNEL(scale_unless_one_stub, CUDA, scale_unless_one_cuda);

}  // namespace fastreduce
