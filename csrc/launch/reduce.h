// Launchers for the reductions: raw pointers, a stream, no torch. The caller
// allocates `workspace` of reduce_workspace_bytes() (the torch layer takes it
// from the caching allocator), so a launch never allocates or synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/reduce_op.h"
#include "../kernels/dtype.h"

namespace fastreduce {

// A dense (outer, len, inner) view of the input, reduced over `len`.
// The output is dense (outer, inner) of the op's torch output type: int64
// for sums and products of integers and bools and for argmax/argmin, bool
// for any/all (uint8 for a uint8 input), the input type otherwise.
// var_mean/std_mean (optional) and aminmax write a second output of the same
// shape: the mean, the max.
struct ReduceProblem {
  ReduceKind kind;
  DType dtype;
  const void* input;  // the plan looks at its alignment
  int64_t outer;
  int64_t len;
  int64_t inner;
  ReduceParams params = {};
  void* second_output = nullptr;
};

size_t reduce_workspace_bytes(const ReduceProblem& problem, int sm_count);

cudaError_t reduce(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                   cudaStream_t stream);

}  // namespace fastreduce
