// Helpers shared by the C++ autograd of every op (autograd.cpp,
// autograd_statistics.cpp).
#pragma once

#include <algorithm>
#include <vector>

#include "autograd_node.h"
#include "common.h"

namespace fastreduce {

inline at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
inline std::optional<at::Tensor> or_none(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

// Reductions save their reduced dims (sorted) and keepdim; a backward
// broadcasts the output gradient back over them.

inline std::vector<int64_t> reduced_dim_list(int64_t ndim, at::OptionalIntArrayRef dim) {
  std::vector<int64_t> dims;
  if (dim.has_value() && !dim->empty()) {
    for (int64_t d : *dim) dims.push_back(wrap_dim(d, ndim));
  } else {
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end());
  return dims;
}

inline void save_dims(NodeContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  ctx->saved_data["dims"] = reduced_dim_list(self.dim(), dim);
  ctx->saved_data["keepdim"] = keepdim;
}

// The output gradient with the reduced dims back as size 1.
inline at::Tensor unsqueeze_reduced(NodeContext* ctx, at::Tensor grad) {
  if (ctx->saved_data["keepdim"].toBool()) return grad;
  for (int64_t d : ctx->saved_data["dims"].toIntVector()) grad = grad.unsqueeze(d);
  return grad;
}

// What the backward of a reduction over (self, dim, keepdim) needs when it
// takes the input and the result (amax/amin, logsumexp).
inline void save_input_and_result(NodeContext* ctx, const at::Tensor& result, const at::Tensor& self,
                                  at::IntArrayRef dim, bool keepdim) {
  save_dims(ctx, self, dim, keepdim);
  ctx->save_for_backward({self, result});
}

// Autograd of var/std/var_mean/std_mean, logsumexp, norm and aminmax
// (autograd_statistics.cpp), added by register_autograd.
void register_statistics_autograd(torch::Library& m);

}  // namespace fastreduce
