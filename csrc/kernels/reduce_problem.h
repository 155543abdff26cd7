// One reduction as the glue, the launchers and the CPU kernels see it: no
// torch, no CUDA.
#pragma once

#include <cstdint>

#include "dtype.h"
#include "reduce_op.h"

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

}  // namespace fastreduce
