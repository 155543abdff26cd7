// The CUDA kernels of the norms and softmax, on the current device and stream.
#include "../launch/norms.h"
#include "../launch/softmax.h"
#include "cuda_utils.h"
#include "kernels.h"

namespace fastreduce {
namespace {

void norm_forward_cuda(const NormShape& shape, const NormForwardBuffers<>& io, double eps) {
  check_cuda(norm_forward(shape, io, eps, current_stream()), shape.op);
}

void norm_backward_cuda(const NormShape& shape, const NormBackwardBuffers<>& io, const NormParamGrads& grads) {
  const size_t bytes = norm_backward_workspace_bytes(shape, grads, sm_count());
  at::Tensor scratch = workspace(bytes);
  check_cuda(norm_backward(shape, io, grads, bytes ? scratch.data_ptr() : nullptr, sm_count(), current_stream()),
             shape.op);
}

void normalize_rows_cuda(const NormShape& shape, const NormApplyBuffers<>& io) {
  check_cuda(normalize_rows(shape, io, sm_count(), current_stream()), shape.op);
}

void softmax_forward_cuda(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io) {
  check_cuda(softmax_forward(shape, io, current_stream()), shape.op);
}

void softmax_backward_cuda(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io) {
  check_cuda(softmax_backward(shape, io, current_stream()), shape.op);
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(norm_forward_stub, CUDA, norm_forward_cuda);
FASTREDUCE_REGISTER_KERNEL(norm_backward_stub, CUDA, norm_backward_cuda);
FASTREDUCE_REGISTER_KERNEL(normalize_rows_stub, CUDA, normalize_rows_cuda);
FASTREDUCE_REGISTER_KERNEL(softmax_forward_stub, CUDA, softmax_forward_cuda);
FASTREDUCE_REGISTER_KERNEL(softmax_backward_stub, CUDA, softmax_backward_cuda);

}  // namespace fastreduce
