// fastreduce's C++ API: the operators of torch.ops.fastreduce as typed
// functions with torch's defaults. Each one calls the operator through the
// dispatcher, as torch.ops.fastreduce.NAME does from Python, so autograd,
// autocast and the CPU or CUDA kernel apply alike. The functions live in
// libfastreduce_ops; with CMake: find_package(fastreduce), then link
// fastreduce::ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/OptionalArrayRef.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace fastreduce {

// Reductions, as torch.sum, torch.mean and torch.prod: no dim reduces every
// dimension; dtype is the accumulation and result type.
at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt, bool keepdim = false,
               std::optional<at::ScalarType> dtype = std::nullopt);
at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt, bool keepdim = false,
                std::optional<at::ScalarType> dtype = std::nullopt);
at::Tensor prod(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt, bool keepdim = false,
                std::optional<at::ScalarType> dtype = std::nullopt);
// As torch.amax and torch.amin: an empty dim reduces every dimension.
at::Tensor amax(const at::Tensor& self, at::IntArrayRef dim = {}, bool keepdim = false);
at::Tensor amin(const at::Tensor& self, at::IntArrayRef dim = {}, bool keepdim = false);

// As torch.var, torch.std, torch.var_mean and torch.std_mean: one pass
// (Welford); correction defaults to 1.
at::Tensor var(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt,
               const std::optional<at::Scalar>& correction = std::nullopt, bool keepdim = false);
at::Tensor std(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt,
               const std::optional<at::Scalar>& correction = std::nullopt, bool keepdim = false);
std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt,
                                            const std::optional<at::Scalar>& correction = std::nullopt,
                                            bool keepdim = false);
std::tuple<at::Tensor, at::Tensor> std_mean(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt,
                                            const std::optional<at::Scalar>& correction = std::nullopt,
                                            bool keepdim = false);

// As torch.logsumexp and torch.linalg.vector_norm.
at::Tensor logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim = false);
at::Tensor norm(const at::Tensor& self, const at::Scalar& ord = 2, at::OptionalIntArrayRef dim = std::nullopt,
                bool keepdim = false, std::optional<at::ScalarType> dtype = std::nullopt);

// As torch.argmax, torch.argmin (no dim: the flattened input), torch.aminmax
// (returns (min, max)), torch.any and torch.all.
at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
at::Tensor argmin(const at::Tensor& self, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
std::tuple<at::Tensor, at::Tensor> aminmax(const at::Tensor& self, std::optional<int64_t> dim = std::nullopt,
                                           bool keepdim = false);
at::Tensor any(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt, bool keepdim = false);
at::Tensor all(const at::Tensor& self, at::OptionalIntArrayRef dim = std::nullopt, bool keepdim = false);

// Each tensor's ord norm, as torch._foreach_norm (the gradient-clipping
// pattern): float32/float16/bfloat16 CUDA tensors in one pass over all.
std::vector<at::Tensor> foreach_norm(at::TensorList tensors, const at::Scalar& ord = 2);

// As torch.nn.functional.layer_norm and rms_norm (eps: none takes the
// input dtype's machine epsilon, as torch).
at::Tensor layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight = std::nullopt,
                      const std::optional<at::Tensor>& bias = std::nullopt, double eps = 1e-5);
at::Tensor rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                    const std::optional<at::Tensor>& weight = std::nullopt, std::optional<double> eps = std::nullopt);

// The pre-norm residual step in one pass: returns (norm(input + residual),
// input + residual), the second being the next block's residual.
std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& input, const at::Tensor& residual,
                                                  at::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight = std::nullopt,
                                                  const std::optional<at::Tensor>& bias = std::nullopt,
                                                  double eps = 1e-5);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                at::IntArrayRef normalized_shape,
                                                const std::optional<at::Tensor>& weight = std::nullopt,
                                                std::optional<double> eps = std::nullopt);

// As torch.softmax; causal_softmax masks the upper triangle of the last two
// dimensions (attention scores, scaled by scale) before the softmax.
at::Tensor softmax(const at::Tensor& self, int64_t dim = -1, std::optional<at::ScalarType> dtype = std::nullopt);
at::Tensor causal_softmax(const at::Tensor& scores, double scale = 1.0);

// As torch.nn.functional.cross_entropy over (N, C) logits and (N,) class
// indices; the _with_lse form also returns each row's logsumexp (float32),
// differentiable, for a z-loss. When cross_entropy's loss (mean or sum) will
// be differentiated, its gradient comes from the forward's one read of the
// logits and the backward only scales it (so one backward per call).
at::Tensor cross_entropy(const at::Tensor& input, const at::Tensor& target, std::string_view reduction = "mean",
                         int64_t ignore_index = -100, double label_smoothing = 0.0);
std::tuple<at::Tensor, at::Tensor> cross_entropy_with_lse(const at::Tensor& input, const at::Tensor& target,
                                                          std::string_view reduction = "mean",
                                                          int64_t ignore_index = -100,
                                                          double label_smoothing = 0.0);

}  // namespace fastreduce
