// The device entry points of the ops: one stub each (device_stub.h), which
// the op code calls with its input's device. Each backend registers its
// kernel where it defines it: csrc/cpu for the CPU, the *_cuda.cpp glue for
// CUDA. "CUDA only": the op
// code takes another way on the CPU.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "../kernels/cross_entropy_buffers.h"
#include "../kernels/norm_buffers.h"
#include "../kernels/reduce_problem.h"
#include "../kernels/scale_problem.h"
#include "../kernels/softmax_buffers.h"
#include "device_stub.h"

namespace fastreduce {

// One reduction (reduce_problem.h) into `output`, on the current device (the
// caller sets it).
FASTREDUCE_DECLARE_STUB(reduce_stub, void(const ReduceProblem& problem, void* output));

// The norm of each of `tensors` (contiguous, float/half types, on one
// device), in one pass over all: a 0-dim tensor of its own each, of its
// tensor's dtype. CUDA only.
FASTREDUCE_DECLARE_STUB(foreach_norm_stub, std::vector<at::Tensor>(at::TensorList tensors, double ord));

// layer_norm and rms_norm, softmax and causal_softmax over the buffers the
// op code prepared, on the current device (the caller sets it).
FASTREDUCE_DECLARE_STUB(norm_forward_stub, void(const NormShape& shape, const NormForwardBuffers<>& io, double eps));
FASTREDUCE_DECLARE_STUB(norm_backward_stub,
                        void(const NormShape& shape, const NormBackwardBuffers<>& io, const NormParamGrads& grads));
// The apply half of a norm from row statistics computed elsewhere. CUDA only.
FASTREDUCE_DECLARE_STUB(normalize_rows_stub, void(const NormShape& shape, const NormApplyBuffers<>& io));
FASTREDUCE_DECLARE_STUB(softmax_forward_stub, void(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io));
FASTREDUCE_DECLARE_STUB(softmax_backward_stub, void(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io));

// Cross-entropy over the buffers the op code prepared (shapes and buffers:
// cross_entropy_buffers.h), on the current device (the caller sets it).
FASTREDUCE_DECLARE_STUB(cross_entropy_forward_stub,
                        void(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io));
FASTREDUCE_DECLARE_STUB(cross_entropy_backward_stub,
                        void(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io));
FASTREDUCE_DECLARE_STUB(cross_entropy_with_grad_stub,
                        void(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io));
// A loss's gradient scaled by the incoming one (scale_problem.h); no host
// synchronisation on CUDA. On the current device (the caller sets it).
FASTREDUCE_DECLARE_STUB(scale_unless_one_stub, void(const ScaleProblem& problem));

// The teaching ladder's rung `rung` summing the contiguous 1-D `flat` into
// `out`; the read probe (a read of `data` that also evicts L2). CUDA only.
FASTREDUCE_DECLARE_STUB(ladder_stub, void(int rung, const at::Tensor& flat, at::Tensor& out));
FASTREDUCE_DECLARE_STUB(read_probe_stub, void(const at::Tensor& data, at::Tensor& flag));

}  // namespace fastreduce
