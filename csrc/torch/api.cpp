// The public C++ API (include/fastreduce/fastreduce.h): each function calls
// its operator through the dispatcher and returns what the Python wrapper
// returns.
#include <fastreduce/fastreduce.h>

#include "dispatch.h"

namespace fastreduce {

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  return call_sum(self, dim, keepdim, dtype);
}

at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype) {
  return call_mean(self, dim, keepdim, dtype);
}

at::Tensor prod(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype) {
  return call_prod(self, dim, keepdim, dtype);
}

at::Tensor amax(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) { return call_amax(self, dim, keepdim); }

at::Tensor amin(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) { return call_amin(self, dim, keepdim); }

at::Tensor var(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
               bool keepdim) {
  return call_var(self, dim, correction, keepdim);
}

at::Tensor std(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
               bool keepdim) {
  return call_stddev(self, dim, correction, keepdim);
}

std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction, bool keepdim) {
  return call_var_mean(self, dim, correction, keepdim);
}

std::tuple<at::Tensor, at::Tensor> std_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction, bool keepdim) {
  return call_stddev_mean(self, dim, correction, keepdim);
}

at::Tensor logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return call_logsumexp(self, dim, keepdim);
}

at::Tensor norm(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype) {
  return call_norm(self, ord, dim, keepdim, dtype);
}

at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return call_argmax(self, dim, keepdim);
}

at::Tensor argmin(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return call_argmin(self, dim, keepdim);
}

std::tuple<at::Tensor, at::Tensor> aminmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return call_aminmax(self, dim, keepdim);
}

at::Tensor any(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  return call_any(self, dim, keepdim);
}

at::Tensor all(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  return call_all(self, dim, keepdim);
}

std::vector<at::Tensor> foreach_norm(at::TensorList tensors, const at::Scalar& ord) {
  return call_foreach_norm(tensors, ord);
}

at::Tensor layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  return std::get<0>(call_layer_norm(input, normalized_shape, weight, bias, eps));
}

at::Tensor rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                    std::optional<double> eps) {
  return std::get<0>(call_rms_norm(input, normalized_shape, weight, eps));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& input, const at::Tensor& residual,
                                                  at::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight,
                                                  const std::optional<at::Tensor>& bias, double eps) {
  auto [out, residual_out, mean, rstd] = call_add_layer_norm(input, residual, normalized_shape, weight, bias, eps);
  return {out, residual_out};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                at::IntArrayRef normalized_shape,
                                                const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  auto [out, residual_out, rstd] = call_add_rms_norm(input, residual, normalized_shape, weight, eps);
  return {out, residual_out};
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return call_softmax(self, dim, dtype);
}

at::Tensor causal_softmax(const at::Tensor& scores, double scale) { return call_causal_softmax(scores, scale); }

std::tuple<at::Tensor, at::Tensor> cross_entropy_with_lse(const at::Tensor& input, const at::Tensor& target,
                                                          std::string_view reduction, int64_t ignore_index,
                                                          double label_smoothing) {
  return call_cross_entropy(input, target, c10::string_view(reduction.data(), reduction.size()), ignore_index,
                            label_smoothing);
}

// A loss that will be differentiated gets its gradient from the forward's
// one read of the logits (the backward only scales it).
at::Tensor cross_entropy(const at::Tensor& input, const at::Tensor& target, std::string_view reduction,
                         int64_t ignore_index, double label_smoothing) {
  const c10::string_view how(reduction.data(), reduction.size());
  if ((how == "mean" || how == "sum") && input.requires_grad() && at::GradMode::is_enabled())
    return std::get<0>(call_cross_entropy_with_grad(input, target, how, ignore_index, label_smoothing));
  return std::get<0>(call_cross_entropy(input, target, how, ignore_index, label_smoothing));
}

}  // namespace fastreduce
