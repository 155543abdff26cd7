// The stubs of kernels.h; each backend registers its kernels where it
// defines them (FASTREDUCE_REGISTER_KERNEL).
#include "kernels.h"

namespace fastreduce {

FASTREDUCE_DEFINE_STUB(reduce_stub, void(const ReduceProblem&, void*));
FASTREDUCE_DEFINE_STUB(foreach_norm_stub, std::vector<at::Tensor>(at::TensorList, double));
FASTREDUCE_DEFINE_STUB(norm_forward_stub, void(const NormShape&, const NormForwardBuffers<>&, double));
FASTREDUCE_DEFINE_STUB(norm_backward_stub, void(const NormShape&, const NormBackwardBuffers<>&, const NormParamGrads&));
FASTREDUCE_DEFINE_STUB(normalize_rows_stub, void(const NormShape&, const NormApplyBuffers<>&));
FASTREDUCE_DEFINE_STUB(softmax_forward_stub, void(const SoftmaxShape&, const SoftmaxForwardBuffers&));
FASTREDUCE_DEFINE_STUB(softmax_backward_stub, void(const SoftmaxShape&, const SoftmaxBackwardBuffers&));
FASTREDUCE_DEFINE_STUB(cross_entropy_forward_stub, void(const CrossEntropyShape&, const CrossEntropyForwardBuffers&));
FASTREDUCE_DEFINE_STUB(cross_entropy_backward_stub,
                       void(const CrossEntropyShape&, const CrossEntropyBackwardBuffers&));
FASTREDUCE_DEFINE_STUB(cross_entropy_with_grad_stub,
                       void(const CrossEntropyShape&, const CrossEntropyWithGradBuffers&));
FASTREDUCE_DEFINE_STUB(scale_unless_one_stub, void(const ScaleProblem&));
FASTREDUCE_DEFINE_STUB(ladder_stub, void(int, const at::Tensor&, at::Tensor&));
FASTREDUCE_DEFINE_STUB(read_probe_stub, void(const at::Tensor&, at::Tensor&));

}  // namespace fastreduce
