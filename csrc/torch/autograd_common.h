// Helpers shared by the C++ autograd of every op (autograd.cpp,
// autograd_statistics.cpp).
#pragma once

#include <algorithm>
#include <vector>

#include "autograd_node.h"
#include "common.h"

namespace fastreduce {

inline bool wants_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool wants_grad(const std::optional<at::Tensor>& t) { return t.has_value() && wants_grad(*t); }

inline bool has_forward_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }
inline bool has_forward_grad(const std::optional<at::Tensor>& t) { return t.has_value() && has_forward_grad(*t); }

// Whether the call records a backward node. Dual tensors (forward-mode AD)
// are refused rather than their tangents dropped.
template <typename... Tensors>
inline bool any_wants_grad(const Tensors&... tensors) {
  TORCH_CHECK_NOT_IMPLEMENTED(!(has_forward_grad(tensors) || ...),
                              "fastreduce: forward-mode AD (dual tensors, torch.func.jvp) is not supported");
  return at::GradMode::is_enabled() && (wants_grad(tensors) || ...);
}

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

// The forward of a reduction F over (self, dim, keepdim) whose backward
// needs the input and the result (amax/amin, logsumexp).
template <typename F>
at::Tensor forward_saving_input_and_result(NodeContext* ctx, const at::Tensor& self, at::IntArrayRef dim,
                                           bool keepdim) {
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    result = F::op_call(self, dim, keepdim);
  }
  save_dims(ctx, self, dim, keepdim);
  ctx->save_for_backward({self, result});
  return result;
}

// Autograd of var/std/var_mean/std_mean, logsumexp, norm and aminmax
// (autograd_statistics.cpp), added by register_autograd.
void register_statistics_autograd(torch::Library& m);

}  // namespace fastreduce
