// Helpers shared by the C++ autograd of every op (autograd.cpp,
// autograd_statistics.cpp).
#pragma once

#include <algorithm>
#include <vector>

#include "autograd_node.h"
#include "common.h"
#include "dispatch.h"

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

// A loss whose gradients the forward computed: the backward scales them in
// place by the incoming gradient, on the device and not at all when it is 1.
// So a second backward through one call (retain_graph) is refused rather
// than scaled twice. grads[0] has a row a target; the others (a weight's)
// are sums over rows. What the ignored rows leave is not scaled (0 * inf
// would be NaN where torch's is 0).
inline void save_to_scale(NodeContext* ctx, const at::Tensor& target, int64_t ignore_index, variable_list grads) {
  ctx->saved_data["scaled"] = false;
  ctx->saved_data["ignore_index"] = ignore_index;
  grads.push_back(target);
  ctx->save_for_backward(std::move(grads));
}
inline variable_list scale_once(NodeContext* ctx, const at::Tensor& grad_out, const char* op) {
  variable_list saved = ctx->get_saved_variables();  // torch's error when they were released
  TORCH_CHECK(!ctx->saved_data["scaled"].toBool(), op,
              ": a second backward through the same call is not supported (its gradient is computed in the "
              "forward and scaled in place by the first)");
  ctx->saved_data["scaled"] = true;
  const at::Tensor target = saved.back();
  saved.pop_back();
  const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!saved[i].defined()) continue;
    saved[i] = saved[i].detach();
    call_scale_unless_one(saved[i], grad_out, target, ignore_index, /*per_row=*/i == 0);
  }
  return saved;
}

// Autograd of var/std/var_mean/std_mean, logsumexp, norm and aminmax
// (autograd_statistics.cpp), added by register_autograd.
void register_statistics_autograd(torch::Library& m);

}  // namespace fastreduce
