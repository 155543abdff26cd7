// Autograd for every differentiable operator, at the Autograd dispatch key as
// aten's own ops have it. A call whose inputs need no gradient goes straight
// to the kernels; otherwise a backward node (autograd_node.h, built the way
// torch's generated ones are) records a backward that calls registered
// operators (fastreduce's backward ops, or aten's), so torch.compile, AOT
// autograd and export trace it like any other op.
#include "autograd_common.h"
#include "dispatch.h"

namespace fastreduce {
namespace {

// ---- reductions: sum and mean also need the input's shape and dtype (not
// the input itself).
void save_reduction(NodeContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  save_dims(ctx, self, dim, keepdim);
  ctx->saved_data["sizes"] = self.sym_sizes();
  ctx->saved_data["dtype"] = self.scalar_type();
}

at::Tensor expand_to_input(NodeContext* ctx, const at::Tensor& grad) {
  return unsqueeze_reduced(ctx, grad).expand_symint(ctx->saved_data["sizes"].toSymIntVector());
}

at::ScalarType input_dtype(NodeContext* ctx) { return ctx->saved_data["dtype"].toScalarType(); }

// sum and mean: the gradient broadcast back over the reduced dims (divided
// by their element count for mean), in the input's dtype.
template <bool IsMean>
struct SumMeanFunction : OpFunction<SumMeanFunction<IsMean>> {
  static constexpr const char* kName = IsMean ? "fastreduce::MeanBackward" : "fastreduce::SumBackward";
  static at::Tensor op_call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    if constexpr (IsMean) {
      return call_mean(self, dim, keepdim, dtype);
    } else {
      return call_sum(self, dim, keepdim, dtype);
    }
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    save_reduction(ctx, self, dim, keepdim);
    at::AutoDispatchBelowADInplaceOrView below;
    return op_call(self, dim, keepdim, dtype);
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    at::Tensor grad = expand_to_input(ctx, grads[0]);
    if constexpr (IsMean) {
      const auto sizes = ctx->saved_data["sizes"].toSymIntVector();
      c10::SymInt count = 1;
      for (int64_t d : ctx->saved_data["dims"].toIntVector()) count = count * sizes[d];
      grad = grad / count;
    }
    return {grad.to(input_dtype(ctx)), {}, {}, {}};
  }
};

struct ProdFunction : OpFunction<ProdFunction> {
  static constexpr const char* kName = "fastreduce::ProdBackward";
  static at::Tensor op_call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    return call_prod(self, dim, keepdim, dtype);
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    at::Tensor result;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      result = op_call(self, dim, keepdim, dtype);
    }
    ctx->saved_data["dim"] = dim.has_value() ? c10::IValue(*dim) : c10::IValue();
    ctx->saved_data["keepdim"] = keepdim;
    ctx->save_for_backward({self, result});
    return result;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& dim = ctx->saved_data["dim"];
    const std::vector<int64_t> dims = dim.isNone() ? std::vector<int64_t>() : dim.toIntVector();
    const at::OptionalIntArrayRef dim_arg = dim.isNone() ? at::OptionalIntArrayRef() : at::IntArrayRef(dims);
    return {call_prod_backward(grads[0], saved[0], saved[1], dim_arg, ctx->saved_data["keepdim"].toBool()), {}, {},
            {}};
  }
};

// amax and amin: ties share the gradient evenly, as in torch.
template <bool IsMax>
struct ExtremumFunction : OpFunction<ExtremumFunction<IsMax>> {
  static constexpr const char* kName = IsMax ? "fastreduce::AmaxBackward" : "fastreduce::AminBackward";
  static at::Tensor op_call(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    if constexpr (IsMax) {
      return call_amax(self, dim, keepdim);
    } else {
      return call_amin(self, dim, keepdim);
    }
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    return forward_saving_input_and_result<ExtremumFunction<IsMax>>(ctx, self, dim, keepdim);
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor ties = saved[0].eq(unsqueeze_reduced(ctx, saved[1])).to(grads[0].scalar_type());
    const at::Tensor count = ties.sum(ctx->saved_data["dims"].toIntVector(), /*keepdim=*/true);
    return {unsqueeze_reduced(ctx, grads[0]) * ties / count, {}, {}};
  }
};

// ---- normalisations: the backward ops take what the forward saved.

struct LayerNormFunction : OpFunction<LayerNormFunction> {
  static constexpr const char* kName = "fastreduce::LayerNormBackward";
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> op_call(const at::Tensor& input,
                                                                at::IntArrayRef normalized_shape,
                                                                const std::optional<at::Tensor>& weight,
                                                                const std::optional<at::Tensor>& bias, double eps) {
    return call_layer_norm(input, normalized_shape, weight, bias, eps);
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                               double eps) {
    at::Tensor out, mean, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, mean, rstd) = op_call(input, normalized_shape, weight, bias, eps);
    }
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->save_for_backward({input, mean, rstd, or_undefined(weight), or_undefined(bias)});
    ctx->mark_non_differentiable({mean, rstd});
    return {out, mean, rstd};
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[3], &bias = saved[4];
    auto [dx, dweight, dbias] =
        call_layer_norm_backward(grads[0], saved[0], ctx->saved_data["normalized_shape"].toIntVector(), saved[1],
                                 saved[2], or_none(weight), or_none(bias), std::nullopt);
    return {dx, {}, weight.defined() ? dweight : at::Tensor(), bias.defined() ? dbias : at::Tensor(), {}};
  }
};

struct RmsNormFunction : OpFunction<RmsNormFunction> {
  static constexpr const char* kName = "fastreduce::RmsNormBackward";
  static std::tuple<at::Tensor, at::Tensor> op_call(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                    const std::optional<at::Tensor>& weight,
                                                    std::optional<double> eps) {
    return call_rms_norm(input, normalized_shape, weight, eps);
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    at::Tensor out, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, rstd) = op_call(input, normalized_shape, weight, eps);
    }
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->save_for_backward({input, rstd, or_undefined(weight)});
    ctx->mark_non_differentiable({rstd});
    return {out, rstd};
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dweight] = call_rms_norm_backward(grads[0], saved[0], ctx->saved_data["normalized_shape"].toIntVector(),
                                                saved[1], or_none(saved[2]), std::nullopt);
    return {dx, {}, saved[2].defined() ? dweight : at::Tensor(), {}};
  }
};

// The fused residual add: the gradient reaching residual_out joins the norm's
// input gradient in the backward kernel, and the sum is the gradient of both
// input and residual.
struct AddLayerNormFunction : OpFunction<AddLayerNormFunction> {
  static constexpr const char* kName = "fastreduce::AddLayerNormBackward";
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> op_call(
      const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
    return call_add_layer_norm(input, residual, normalized_shape, weight, bias, eps);
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
    at::Tensor out, residual_out, mean, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, residual_out, mean, rstd) = op_call(input, residual, normalized_shape, weight, bias, eps);
    }
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->save_for_backward({residual_out, mean, rstd, or_undefined(weight), or_undefined(bias)});
    ctx->mark_non_differentiable({mean, rstd});
    return {out, residual_out, mean, rstd};
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[3], &bias = saved[4];
    auto [dx, dweight, dbias] =
        call_layer_norm_backward(grads[0], saved[0], ctx->saved_data["normalized_shape"].toIntVector(), saved[1],
                                 saved[2], or_none(weight), or_none(bias), grads[1]);
    return {dx, dx, {}, weight.defined() ? dweight : at::Tensor(), bias.defined() ? dbias : at::Tensor(), {}};
  }
};

struct AddRmsNormFunction : OpFunction<AddRmsNormFunction> {
  static constexpr const char* kName = "fastreduce::AddRmsNormBackward";
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> op_call(const at::Tensor& input, const at::Tensor& residual,
                                                                at::IntArrayRef normalized_shape,
                                                                const std::optional<at::Tensor>& weight,
                                                                std::optional<double> eps) {
    return call_add_rms_norm(input, residual, normalized_shape, weight, eps);
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                               std::optional<double> eps) {
    at::Tensor out, residual_out, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, residual_out, rstd) = op_call(input, residual, normalized_shape, weight, eps);
    }
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->save_for_backward({residual_out, rstd, or_undefined(weight)});
    ctx->mark_non_differentiable({rstd});
    return {out, residual_out, rstd};
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dweight] = call_rms_norm_backward(grads[0], saved[0], ctx->saved_data["normalized_shape"].toIntVector(),
                                                saved[1], or_none(saved[2]), grads[1]);
    return {dx, dx, {}, saved[2].defined() ? dweight : at::Tensor(), {}};
  }
};

// lse is differentiable too (z-loss: d lse / d x = softmax(x)). Gradients are
// not materialised: an unused loss or lse costs nothing in the backward.
struct CrossEntropyFunction : OpFunction<CrossEntropyFunction> {
  static constexpr const char* kName = "fastreduce::CrossEntropyBackward";
  static std::tuple<at::Tensor, at::Tensor> op_call(const at::Tensor& input, const at::Tensor& target,
                                                    c10::string_view reduction, int64_t ignore_index,
                                                    double label_smoothing) {
    return call_cross_entropy(input, target, reduction, ignore_index, label_smoothing);
  }
  static variable_list forward(NodeContext* ctx, const at::Tensor& input, const at::Tensor& target,
                               c10::string_view reduction, int64_t ignore_index, double label_smoothing) {
    at::Tensor loss, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, lse) = op_call(input, target, reduction, ignore_index, label_smoothing);
    }
    ctx->set_materialize_grads(false);
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->save_for_backward({input, target, lse});
    return {loss, lse};
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::string reduction = ctx->saved_data["reduction"].toStringRef();
    at::Tensor grad_loss = grads[0];
    if (!grad_loss.defined())
      grad_loss = reduction == "none" ? saved[0].new_zeros({saved[0].size(0)}) : saved[0].new_zeros({});
    const at::Tensor dx = call_cross_entropy_backward(
        grad_loss, or_none(grads[1]), saved[0], saved[1], saved[2], reduction,
        ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["label_smoothing"].toDouble());
    return {dx, {}, {}, {}, {}};
  }
};

struct SoftmaxFunction : OpFunction<SoftmaxFunction> {
  static constexpr const char* kName = "fastreduce::SoftmaxBackward";
  static at::Tensor op_call(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
    return call_softmax(self, dim, dtype);
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& self, int64_t dim,
                            std::optional<at::ScalarType> dtype) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = op_call(self, dim, dtype);
    }
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["dtype"] = self.scalar_type();
    ctx->save_for_backward({out});
    return out;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const at::Tensor dx = call_softmax_backward(grads[0], out, ctx->saved_data["dim"].toInt());
    return {dx.to(input_dtype(ctx)), {}, {}};
  }
};

struct CausalSoftmaxFunction : OpFunction<CausalSoftmaxFunction> {
  static constexpr const char* kName = "fastreduce::CausalSoftmaxBackward";
  static at::Tensor op_call(const at::Tensor& scores, double scale) {
    return call_causal_softmax(scores, scale);
  }
  static at::Tensor forward(NodeContext* ctx, const at::Tensor& scores, double scale) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = op_call(scores, scale);
    }
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({out});
    return out;
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    return {call_causal_softmax_backward(grads[0], out, ctx->saved_data["scale"].toDouble()), {}};
  }
};

// ---- the Autograd-key kernels: the Function only when a gradient is wanted.

template <typename F>
at::Tensor reduction_autograd(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype) {
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return F::op_call(self, dim, keepdim, dtype);
  }
  return F::apply(self, dim, keepdim, dtype);
}

template <bool IsMax>
at::Tensor extremum_autograd(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return ExtremumFunction<IsMax>::op_call(self, dim, keepdim);
  }
  return ExtremumFunction<IsMax>::apply(self, dim, keepdim);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_autograd(const at::Tensor& input,
                                                                   at::IntArrayRef normalized_shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  if (!any_wants_grad(input, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return LayerNormFunction::op_call(input, normalized_shape, weight, bias, eps);
  }
  const auto outputs = LayerNormFunction::apply(input, normalized_shape, weight, bias, eps);
  return {outputs[0], outputs[1], outputs[2]};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_autograd(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                     const std::optional<at::Tensor>& weight,
                                                     std::optional<double> eps) {
  if (!any_wants_grad(input, weight)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return RmsNormFunction::op_call(input, normalized_shape, weight, eps);
  }
  const auto outputs = RmsNormFunction::apply(input, normalized_shape, weight, eps);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_autograd(
    const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  if (!any_wants_grad(input, residual, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return AddLayerNormFunction::op_call(input, residual, normalized_shape, weight, bias, eps);
  }
  const auto outputs = AddLayerNormFunction::apply(input, residual, normalized_shape, weight, bias, eps);
  return {outputs[0], outputs[1], outputs[2], outputs[3]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_autograd(const at::Tensor& input,
                                                                     const at::Tensor& residual,
                                                                     at::IntArrayRef normalized_shape,
                                                                     const std::optional<at::Tensor>& weight,
                                                                     std::optional<double> eps) {
  if (!any_wants_grad(input, residual, weight)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return AddRmsNormFunction::op_call(input, residual, normalized_shape, weight, eps);
  }
  const auto outputs = AddRmsNormFunction::apply(input, residual, normalized_shape, weight, eps);
  return {outputs[0], outputs[1], outputs[2]};
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_autograd(const at::Tensor& input, const at::Tensor& target,
                                                          c10::string_view reduction, int64_t ignore_index,
                                                          double label_smoothing) {
  if (!any_wants_grad(input)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return CrossEntropyFunction::op_call(input, target, reduction, ignore_index, label_smoothing);
  }
  const auto outputs = CrossEntropyFunction::apply(input, target, reduction, ignore_index, label_smoothing);
  return {outputs[0], outputs[1]};
}

at::Tensor softmax_autograd(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  if (!any_wants_grad(self)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return SoftmaxFunction::op_call(self, dim, dtype);
  }
  return SoftmaxFunction::apply(self, dim, dtype);
}

at::Tensor causal_softmax_autograd(const at::Tensor& scores, double scale) {
  if (!any_wants_grad(scores)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return CausalSoftmaxFunction::op_call(scores, scale);
  }
  return CausalSoftmaxFunction::apply(scores, scale);
}

}  // namespace

void register_autograd(torch::Library& m) {
  m.impl("sum", &reduction_autograd<SumMeanFunction<false>>);
  m.impl("mean", &reduction_autograd<SumMeanFunction<true>>);
  m.impl("prod", &reduction_autograd<ProdFunction>);
  m.impl("amax", &extremum_autograd<true>);
  m.impl("amin", &extremum_autograd<false>);
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_layer_norm", &add_layer_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("softmax", &softmax_autograd);
  m.impl("causal_softmax", &causal_softmax_autograd);
  register_statistics_autograd(m);
}

}  // namespace fastreduce
