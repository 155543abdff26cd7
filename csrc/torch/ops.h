// The operators' backend kernels: one device-independent entry per schema,
// which checks the arguments and runs the CPU or CUDA implementation.
// registration.cpp binds them to the CPU and CUDA keys. They sit below
// autograd and autocast: callers go through the dispatcher (dispatch.h, or
// the public C++ API in include/fastreduce/fastreduce.h).
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fastreduce {

namespace backend {

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype);
at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor prod(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor prod_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& result,
                         at::OptionalIntArrayRef dim, bool keepdim);
at::Tensor amax(const at::Tensor& self, at::IntArrayRef dim, bool keepdim);
at::Tensor amin(const at::Tensor& self, at::IntArrayRef dim, bool keepdim);

at::Tensor var(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
               bool keepdim);
at::Tensor stddev(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
                  bool keepdim);
std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                             const std::optional<at::Scalar>& correction, bool keepdim);
std::tuple<at::Tensor, at::Tensor> stddev_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                               const std::optional<at::Scalar>& correction, bool keepdim);
at::Tensor logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim);
at::Tensor norm(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim);
at::Tensor argmin(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim);
std::tuple<at::Tensor, at::Tensor> aminmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim);
at::Tensor any(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim);
at::Tensor all(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim);
std::vector<at::Tensor> foreach_norm(at::TensorList tensors, const at::Scalar& ord);

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& grad_residual);
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                            const std::optional<at::Tensor>& weight, std::optional<double> eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                     at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& weight,
                                                     const std::optional<at::Tensor>& grad_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm(
    const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                            at::IntArrayRef normalized_shape,
                                                            const std::optional<at::Tensor>& weight,
                                                            std::optional<double> eps);
std::tuple<at::Tensor, at::Tensor> cross_entropy(const at::Tensor& input, const at::Tensor& target,
                                                 c10::string_view reduction, int64_t ignore_index,
                                                 double label_smoothing);
at::Tensor cross_entropy_backward(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                  const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                  c10::string_view reduction, int64_t ignore_index, double label_smoothing);
// The same gradient written over `input` (contiguous), for callers that no
// longer need the logits (cross_entropy(..., inplace_backward=True)).
void cross_entropy_backward_inplace(const at::Tensor& input, const at::Tensor& grad_loss,
                                    const std::optional<at::Tensor>& grad_lse, const at::Tensor& target,
                                    const at::Tensor& lse, c10::string_view reduction, int64_t ignore_index,
                                    double label_smoothing);
// The loss (reduction mean or sum) and its gradient from one read of the
// logits (the gradient computed in the forward, for a loss that will be
// differentiated); the _ form writes the gradient over `input` (contiguous)
// and returns the loss.
std::tuple<at::Tensor, at::Tensor> cross_entropy_with_grad(const at::Tensor& input, const at::Tensor& target,
                                                           c10::string_view reduction, int64_t ignore_index,
                                                           double label_smoothing);
at::Tensor cross_entropy_with_grad_inplace(const at::Tensor& input, const at::Tensor& target,
                                           c10::string_view reduction, int64_t ignore_index, double label_smoothing);
// self *= factor (one element) unless factor is 1: a loss's gradient computed
// in the forward, scaled in the backward without a host synchronisation.
// With the loss's target, what torch's backward never scales is left as it
// is (scale_problem.h): the ignored rows (per_row: a target a row of self),
// or all of self when every target is ignored.
void scale_unless_one(const at::Tensor& self, const at::Tensor& factor, const std::optional<at::Tensor>& target,
                      int64_t ignore_index, bool per_row);
// The cross-entropy of hidden @ weight.T + bias by row chunks
// (fused_linear_cross_entropy.cpp). _with_grads also returns the loss's
// gradients (the autograd node scales them by the incoming one); the backward
// recomputes each chunk's logits (reduction 'none').
std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                              const at::Tensor& target,
                                                              const std::optional<at::Tensor>& bias,
                                                              c10::string_view reduction, int64_t ignore_index,
                                                              double label_smoothing, std::optional<double> softcap);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_with_grads(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    c10::string_view reduction, int64_t ignore_index, double label_smoothing, std::optional<double> softcap);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const at::Tensor& lse, c10::string_view reduction, int64_t ignore_index,
    double label_smoothing, std::optional<double> softcap);
// The halves of a norm over rows split across ranks (split_norm.cpp).
std::tuple<at::Tensor, at::Tensor> row_moments(const at::Tensor& input);
at::Tensor normalize_rows(const at::Tensor& input, const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias);
at::Tensor softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype);
at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim);
at::Tensor causal_softmax(const at::Tensor& scores, double scale);
at::Tensor causal_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, double scale);

at::Tensor sum_variant(const at::Tensor& self, c10::string_view variant);
at::Tensor read_probe(const at::Tensor& self);

}  // namespace backend

// Autograd (autograd.cpp) and autocast (autocast.cpp) kernels of every
// differentiable operator, added to the registration blocks.
void register_autograd(torch::Library& m);
void register_autocast_cuda(torch::Library& m);
void register_autocast_cpu(torch::Library& m);

}  // namespace fastreduce
