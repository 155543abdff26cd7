// Autograd of var/std/var_mean/std_mean, logsumexp, the vector norm and
// aminmax, with torch's derivative formulas written in aten ops (and
// fastreduce's mean), so compile and export trace the backward.
#include <cmath>

#include "autograd_common.h"
#include "dispatch.h"

namespace fastreduce {
namespace {

// Elements folded into each output element, as a SymInt for dynamic shapes.
c10::SymInt reduced_count(NodeContext* ctx, const at::Tensor& self) {
  c10::SymInt count = 1;
  for (int64_t d : ctx->saved_data["dims"].toIntVector()) count = count * self.sym_size(d);
  return count;
}

// var, std, var_mean, std_mean. d var / dx = 2 (x - mean) / (N - correction);
// std's chain rule divides by 2 std (0 where std is 0, as torch); the mean's
// gradient spreads 1/N over its elements.
template <bool kRoot, bool kWithMean>
struct MomentsFunction : OpFunction<MomentsFunction<kRoot, kWithMean>> {
  static constexpr const char* kName = kWithMean ? (kRoot ? "fastreduce::StdMeanBackward" : "fastreduce::VarMeanBackward")
                                             : (kRoot ? "fastreduce::StdBackward" : "fastreduce::VarBackward");
  static variable_list op_call(const at::Tensor& self, at::OptionalIntArrayRef dim,
                               const std::optional<at::Scalar>& correction, bool keepdim) {
    if constexpr (kWithMean) {
      auto [spread, mean] = kRoot ? call_stddev_mean(self, dim, correction, keepdim)
                                  : call_var_mean(self, dim, correction, keepdim);
      return {spread, mean};
    } else {
      return {kRoot ? call_stddev(self, dim, correction, keepdim) : call_var(self, dim, correction, keepdim)};
    }
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim,
                               const std::optional<at::Scalar>& correction, bool keepdim) {
    variable_list outputs;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      outputs = op_call(self, dim, correction, keepdim);
    }
    save_dims(ctx, self, dim, keepdim);
    ctx->saved_data["correction"] = correction.has_value() ? correction->toDouble() : 1.0;
    ctx->save_for_backward({self, outputs[0]});
    return outputs;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &self = saved[0], &spread = saved[1];
    const c10::SymInt count = reduced_count(ctx, self);
    const auto dims = ctx->saved_data["dims"].toIntVector();
    at::Tensor grad;
    if (grads[0].defined()) {
      at::Tensor grad_var = unsqueeze_reduced(ctx, grads[0]);
      if constexpr (kRoot) {
        const at::Tensor deviation = unsqueeze_reduced(ctx, spread);
        grad_var = at::where(deviation == 0, at::zeros({}, deviation.options()), grad_var / (2 * deviation));
      }
      const at::Tensor centered = self - call_mean(self, dims, true, std::nullopt);
      const c10::SymFloat divisor = count - ctx->saved_data["correction"].toDouble();
      grad = grad_var * centered * 2 / at::Scalar(divisor);
    }
    if (kWithMean && grads.size() > 1 && grads[1].defined()) {
      const at::Tensor grad_mean = unsqueeze_reduced(ctx, grads[1]).expand_symint(self.sym_sizes()) / count;
      grad = grad.defined() ? grad + grad_mean : grad_mean;
    }
    return {grad, {}, {}, {}};
  }
};

template <bool kRoot, bool kWithMean>
auto moments_autograd(const at::Tensor& self, at::OptionalIntArrayRef dim,
                      const std::optional<at::Scalar>& correction, bool keepdim) {
  using F = MomentsFunction<kRoot, kWithMean>;
  variable_list outputs;
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    outputs = F::op_call(self, dim, correction, keepdim);
  } else {
    outputs = F::apply(self, dim, correction, keepdim);
  }
  if constexpr (kWithMean) return std::tuple<at::Tensor, at::Tensor>(outputs[0], outputs[1]);
  else return outputs[0];
}

// d logsumexp / dx = exp(x - logsumexp).
struct LogSumExpFunction : OpFunction<LogSumExpFunction> {
  static constexpr const char* kName = "fastreduce::LogsumexpBackward";
  static at::Tensor op_call(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return call_logsumexp(self, dim, keepdim);
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return forward_saving_input_and_result<LogSumExpFunction>(ctx, self, dim, keepdim);
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {unsqueeze_reduced(ctx, grads[0]) * (saved[0] - unsqueeze_reduced(ctx, saved[1])).exp(), {}, {}};
  }
};

at::Tensor logsumexp_autograd(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return LogSumExpFunction::op_call(self, dim, keepdim);
  }
  return LogSumExpFunction::apply(self, dim, keepdim);
}

// torch's linalg_vector_norm_backward, order by order; computed in the
// norm's dtype, returned in the input's.
at::Tensor norm_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& norm, double ord,
                         const std::vector<int64_t>& dims) {
  const at::Tensor x = self.to(norm.scalar_type());
  const at::Tensor zero = at::zeros({}, x.options());
  if (ord == 0) return at::zeros_like(self);
  if (ord == 1) return (x.sgn() * grad).to(self.scalar_type());
  if (ord == 2) return (x * at::where(norm == 0, zero, grad / norm)).to(self.scalar_type());
  if (std::isinf(ord)) {
    const at::Tensor ties = x.sgn() * (x.abs() == norm);
    return (grad * ties / ties.abs().sum(dims, true)).to(self.scalar_type());
  }
  if (ord < 1) {
    const at::Tensor scaled = at::where(x == 0, zero, x.sgn() * x.abs().pow(ord - 1));
    return (scaled * grad * norm.pow(1 - ord)).to(self.scalar_type());
  }
  const at::Tensor scale = at::where(norm == 0, zero, grad / norm.pow(ord - 1));
  return (x * x.abs().pow(ord - 2) * scale).to(self.scalar_type());
}

struct NormFunction : OpFunction<NormFunction> {
  static constexpr const char* kName = "fastreduce::NormBackward";
  static at::Tensor op_call(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    return call_norm(self, ord, dim, keepdim, dtype);
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, const at::Scalar& ord,
                            at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    at::Tensor result;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      result = op_call(self, ord, dim, keepdim, dtype);
    }
    save_dims(ctx, self, dim, keepdim);
    ctx->saved_data["ord"] = ord.toDouble();
    ctx->save_for_backward({self, result});
    return result;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {norm_backward(unsqueeze_reduced(ctx, grads[0]), saved[0], unsqueeze_reduced(ctx, saved[1]),
                          ctx->saved_data["ord"].toDouble(), ctx->saved_data["dims"].toIntVector()),
            {}, {}, {}, {}};
  }
};

at::Tensor norm_autograd(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return NormFunction::op_call(self, ord, dim, keepdim, dtype);
  }
  return NormFunction::apply(self, ord, dim, keepdim, dtype);
}

// aminmax: each extreme's gradient shared evenly among its ties, as amin
// and amax.
struct AminmaxFunction : OpFunction<AminmaxFunction> {
  static constexpr const char* kName = "fastreduce::AminmaxBackward";
  static variable_list op_call(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
    auto [min, max] = call_aminmax(self, dim, keepdim);
    return {min, max};
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& self, std::optional<int64_t> dim,
                               bool keepdim) {
    variable_list outputs;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      outputs = op_call(self, dim, keepdim);
    }
    if (dim.has_value()) save_dims(ctx, self, at::IntArrayRef(*dim), keepdim);
    else save_dims(ctx, self, std::nullopt, keepdim);
    ctx->save_for_backward({self, outputs[0], outputs[1]});
    return outputs;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dims = ctx->saved_data["dims"].toIntVector();
    at::Tensor grad;
    for (int k = 0; k < 2; ++k) {
      if (!grads[k].defined()) continue;
      const at::Tensor ties = saved[0].eq(unsqueeze_reduced(ctx, saved[1 + k])).to(grads[k].scalar_type());
      const at::Tensor part = unsqueeze_reduced(ctx, grads[k]) * ties / ties.sum(dims, true);
      grad = grad.defined() ? grad + part : part;
    }
    return {grad, {}, {}};
  }
};

std::tuple<at::Tensor, at::Tensor> aminmax_autograd(const at::Tensor& self, std::optional<int64_t> dim,
                                                    bool keepdim) {
  variable_list outputs;
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    outputs = AminmaxFunction::op_call(self, dim, keepdim);
  } else {
    outputs = AminmaxFunction::apply(self, dim, keepdim);
  }
  return {outputs[0], outputs[1]};
}

}  // namespace

void register_statistics_autograd(torch::Library& m) {
  m.impl("var", &moments_autograd<false, false>);
  m.impl("std", &moments_autograd<true, false>);
  m.impl("var_mean", &moments_autograd<false, true>);
  m.impl("std_mean", &moments_autograd<true, true>);
  m.impl("logsumexp", &logsumexp_autograd);
  m.impl("norm", &norm_autograd);
  m.impl("aminmax", &aminmax_autograd);
}

}  // namespace fastreduce
