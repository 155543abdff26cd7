// The shared torch-side machinery of every reduction op: which dims fold,
// the output shape, and one run of a kernel kind over any strided input
// (reduce.cpp). The op files (reduce.cpp, statistics.cpp, selection.cpp)
// add each op's semantics on top.
#pragma once

#include <bitset>
#include <utility>
#include <vector>

#include "../kernels/reduce_op.h"
#include "common.h"

namespace fastreduce {

constexpr size_t kMaxDims = 64;

// The dims a reduction folds: those in `dim`, or all when it is None or
// empty; a repeated dim raises.
std::bitset<kMaxDims> reduced_dims(int64_t ndim, at::OptionalIntArrayRef dim);

std::vector<int64_t> output_shape(const at::Tensor& x, const std::bitset<kMaxDims>& reduced, bool keepdim);

// Elements folded into each output element: the product of the reduced
// sizes (symbolic under dynamic shapes).
c10::SymInt reduced_count(const at::Tensor& x, const std::bitset<kMaxDims>& reduced);

// torch's errors for a reduction with no identity (amax, argmax, aminmax)
// over no elements.
void check_nonempty_reduction(const char* op, const at::Tensor& x, const std::bitset<kMaxDims>& reduced,
                              bool dim_given);

// Runs `kind` over the reduced dims of a non-empty x into new contiguous
// outputs of out_dtype (a second one for var_mean and aminmax), copying x
// only when no dense view fits.
std::pair<at::Tensor, at::Tensor> run_reduction(ReduceKind kind, const ReduceParams& params, const at::Tensor& x,
                                                const std::bitset<kMaxDims>& reduced, bool keepdim,
                                                at::ScalarType out_dtype, bool two_outputs = false);

}  // namespace fastreduce
