// Autograd of var/std/var_mean/std_mean, logsumexp, the vector norm and
// aminmax, with torch's derivative formulas written in aten ops (and
// fastreduce's mean), so compile and export trace the backward.
#include <cmath>

#include "autograd_common.h"
#include "dispatch.h"
#include "reduction.h"

namespace fastreduce {
namespace {

// Elements folded into each output element of the forward (its saved dims).
c10::SymInt forward_count(NodeContext* ctx, const at::Tensor& self) {
  std::bitset<kMaxDims> reduced;
  for (int64_t d : ctx->saved_data["dims"].toIntVector()) reduced.set(d);
  return reduced_count(self, reduced);
}

// var, std, var_mean, std_mean. d var / dx = 2 (x - mean) / (N - correction);
// std's chain rule divides by 2 std (0 where std is 0, as torch); the mean's
// gradient spreads 1/N over its elements.
template <bool kRoot, bool kWithMean>
struct MomentsFunction {
  using Outputs = std::conditional_t<kWithMean, std::tuple<at::Tensor, at::Tensor>, at::Tensor>;
  static constexpr const char* kName = kWithMean ? (kRoot ? "fastreduce::StdMeanBackward" : "fastreduce::VarMeanBackward")
                                             : (kRoot ? "fastreduce::StdBackward" : "fastreduce::VarBackward");
  static Outputs op_call(const at::Tensor& self, at::OptionalIntArrayRef dim,
                         const std::optional<at::Scalar>& correction, bool keepdim) {
    if constexpr (kWithMean) {
      return kRoot ? call_stddev_mean(self, dim, correction, keepdim) : call_var_mean(self, dim, correction, keepdim);
    } else {
      return kRoot ? call_stddev(self, dim, correction, keepdim) : call_var(self, dim, correction, keepdim);
    }
  }
  static void save(NodeContext* ctx, const Outputs& outputs, const at::Tensor& self, at::OptionalIntArrayRef dim,
                   const std::optional<at::Scalar>& correction, bool keepdim) {
    save_dims(ctx, self, dim, keepdim);
    ctx->saved_data["correction"] = correction.has_value() ? correction->toDouble() : 1.0;
    if constexpr (kWithMean) {
      ctx->save_for_backward({self, std::get<0>(outputs)});
    } else {
      ctx->save_for_backward({self, outputs});
    }
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &self = saved[0], &spread = saved[1];
    const c10::SymInt count = forward_count(ctx, self);
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


// d logsumexp / dx = exp(x - logsumexp).
struct LogSumExpFunction {
  static constexpr const char* kName = "fastreduce::LogsumexpBackward";
  static at::Tensor op_call(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return call_logsumexp(self, dim, keepdim);
  }
  static constexpr auto save = save_input_and_result;
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {unsqueeze_reduced(ctx, grads[0]) * (saved[0] - unsqueeze_reduced(ctx, saved[1])).exp(), {}, {}};
  }
};


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

struct NormFunction {
  static constexpr const char* kName = "fastreduce::NormBackward";
  static at::Tensor op_call(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    return call_norm(self, ord, dim, keepdim, dtype);
  }
  static void save(NodeContext* ctx, const at::Tensor& result, const at::Tensor& self, const at::Scalar& ord,
                   at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType>) {
    save_dims(ctx, self, dim, keepdim);
    ctx->saved_data["ord"] = ord.toDouble();
    ctx->save_for_backward({self, result});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {norm_backward(unsqueeze_reduced(ctx, grads[0]), saved[0], unsqueeze_reduced(ctx, saved[1]),
                          ctx->saved_data["ord"].toDouble(), ctx->saved_data["dims"].toIntVector()),
            {}, {}, {}, {}};
  }
};


// aminmax: each extreme's gradient shared evenly among its ties, as amin
// and amax.
struct AminmaxFunction {
  using Outputs = std::tuple<at::Tensor, at::Tensor>;
  static constexpr const char* kName = "fastreduce::AminmaxBackward";
  static Outputs op_call(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
    return call_aminmax(self, dim, keepdim);
  }
  static void save(NodeContext* ctx, const Outputs& outputs, const at::Tensor& self, std::optional<int64_t> dim,
                   bool keepdim) {
    if (dim.has_value()) save_dims(ctx, self, at::IntArrayRef(*dim), keepdim);
    else save_dims(ctx, self, std::nullopt, keepdim);
    ctx->save_for_backward({self, std::get<0>(outputs), std::get<1>(outputs)});
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


}  // namespace

void register_statistics_autograd(torch::Library& m) {
  m.impl("var", &Autograd<MomentsFunction<false, false>>::kernel);
  m.impl("std", &Autograd<MomentsFunction<true, false>>::kernel);
  m.impl("var_mean", &Autograd<MomentsFunction<false, true>>::kernel);
  m.impl("std_mean", &Autograd<MomentsFunction<true, true>>::kernel);
  m.impl("logsumexp", &Autograd<LogSumExpFunction>::kernel);
  m.impl("norm", &Autograd<NormFunction>::kernel);
  m.impl("aminmax", &Autograd<AminmaxFunction>::kernel);
}

}  // namespace fastreduce
