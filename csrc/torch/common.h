// Shared by the torch glue: dtype mapping and the backend entry points that
// the device-independent op code calls.
#pragma once

#include <ATen/ATen.h>

#include "../kernels/reduce_op.h"
#include "../kernels/dtype.h"

namespace fastreduce {

// Maps the dtypes the kernels support; raises a RuntimeError naming `op` and
// the dtype otherwise.
DType to_dtype(at::ScalarType type, const char* op);

// Reduces the dense (outer, len, inner) view `input` over len into the dense
// `out` (outer * inner elements of the op's output type).
void reduce_cpu(ReduceKind kind, const at::Tensor& input, int64_t outer, int64_t len, int64_t inner,
                at::Tensor& out);
void reduce_cuda(ReduceKind kind, const at::Tensor& input, int64_t outer, int64_t len, int64_t inner,
                 at::Tensor& out);

// Sums the contiguous 1-D CUDA tensor `flat` with ladder rung `rung` into `out`.
void ladder_cuda(int rung, const at::Tensor& flat, at::Tensor& out);
void read_probe_cuda(const at::Tensor& data, at::Tensor& flag);

}  // namespace fastreduce
