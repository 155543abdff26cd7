// Autograd for every differentiable operator, at the Autograd dispatch key as
// aten's own ops have it. A call whose inputs need no gradient goes straight
// to the kernels; otherwise a backward node (autograd_node.h, built the way
// torch's generated ones are) records a backward that calls registered
// operators (fastreduce's backward ops, or aten's), so torch.compile, AOT
// autograd and export trace it like any other op.
#include "autograd_common.h"
#include "../kernels/norm_buffers.h"
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

// An input that wants a gradient cannot reach an integer result (x.sum(dtype=torch.int64)), as in torch.
void check_differentiable(const at::Tensor& result) {
  TORCH_CHECK(torch::autograd::isDifferentiableType(result.scalar_type()), "Autograd not support dtype: ",
              to_text(result.scalar_type()));
}

// sum and mean: the gradient broadcast back over the reduced dims (divided
// by their element count for mean), in the input's dtype.
template <bool IsMean>
struct SumMeanFunction {
  static constexpr const char* kName = IsMean ? "fastreduce::MeanBackward" : "fastreduce::SumBackward";
  static at::Tensor op_call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    if constexpr (IsMean) {
      return call_mean(self, dim, keepdim, dtype);
    } else {
      return call_sum(self, dim, keepdim, dtype);
    }
  }
  static void save(NodeContext* ctx, const at::Tensor& result, const at::Tensor& self, at::OptionalIntArrayRef dim,
                   bool keepdim, std::optional<at::ScalarType>) {
    check_differentiable(result);
    save_reduction(ctx, self, dim, keepdim);
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

struct ProdFunction {
  static constexpr const char* kName = "fastreduce::ProdBackward";
  static at::Tensor op_call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                            std::optional<at::ScalarType> dtype) {
    return call_prod(self, dim, keepdim, dtype);
  }
  static void save(NodeContext* ctx, const at::Tensor& result, const at::Tensor& self, at::OptionalIntArrayRef dim,
                   bool keepdim, std::optional<at::ScalarType>) {
    check_differentiable(result);
    ctx->saved_data["dim"] = dim.has_value() ? c10::IValue(*dim) : c10::IValue();
    ctx->saved_data["keepdim"] = keepdim;
    ctx->save_for_backward({self, result});
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
struct ExtremumFunction {
  static constexpr const char* kName = IsMax ? "fastreduce::AmaxBackward" : "fastreduce::AminBackward";
  static at::Tensor op_call(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
    if constexpr (IsMax) {
      return call_amax(self, dim, keepdim);
    } else {
      return call_amin(self, dim, keepdim);
    }
  }
  static constexpr auto save = save_input_and_result;
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor ties = saved[0].eq(unsqueeze_reduced(ctx, saved[1])).to(grads[0].scalar_type());
    const at::Tensor count = ties.sum(ctx->saved_data["dims"].toIntVector(), /*keepdim=*/true);
    return {unsqueeze_reduced(ctx, grads[0]) * ties / count, {}, {}};
  }
};

// ---- normalisations: the backward ops take what the forward saved; the
// statistics are outputs without a gradient.

using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensors2 = std::tuple<at::Tensor, at::Tensor>;

// A norm node's saved state: the rows normalised (the input, or h for the
// fused add), its statistics and the parameters. Layer norm saves mean and
// rstd, RMS norm rstd alone.
void save_norm(NodeContext* ctx, at::IntArrayRef normalized_shape, std::vector<at::Tensor> rows_and_stats,
               std::initializer_list<std::optional<at::Tensor>> params) {
  ctx->saved_data["normalized_shape"] = normalized_shape;
  ctx->mark_non_differentiable(variable_list(rows_and_stats.begin() + 1, rows_and_stats.end()));
  for (const auto& param : params) rows_and_stats.push_back(or_undefined(param));
  ctx->save_for_backward(rows_and_stats);
}

// The norm's gradients from what save_norm kept: (dx, dweight, dbias), each
// parameter's undefined when it was absent. grad_residual: the gradient
// reaching the fused add's h, which joins dx.
Tensors3 norm_grads(NodeContext* ctx, NormKind kind, const at::Tensor& grad_out,
                    const std::optional<at::Tensor>& grad_residual) {
  const auto saved = ctx->get_saved_variables();
  const auto shape = ctx->saved_data["normalized_shape"].toIntVector();
  const auto only_if = [](const at::Tensor& param, const at::Tensor& grad) {
    return param.defined() ? grad : at::Tensor();
  };
  if (kind == NormKind::Layer) {
    const at::Tensor &weight = saved[3], &bias = saved[4];
    auto [dx, dweight, dbias] = call_layer_norm_backward(grad_out, saved[0], shape, saved[1], saved[2],
                                                         or_none(weight), or_none(bias), grad_residual);
    return {dx, only_if(weight, dweight), only_if(bias, dbias)};
  }
  const at::Tensor& weight = saved[2];
  auto [dx, dweight] = call_rms_norm_backward(grad_out, saved[0], shape, saved[1], or_none(weight), grad_residual);
  return {dx, only_if(weight, dweight), at::Tensor()};
}

struct LayerNormFunction {
  static constexpr const char* kName = "fastreduce::LayerNormBackward";
  static Tensors3 op_call(const at::Tensor& input, at::IntArrayRef normalized_shape,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
    return call_layer_norm(input, normalized_shape, weight, bias, eps);
  }
  static void save(NodeContext* ctx, const Tensors3& out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double) {
    const auto& [y, mean, rstd] = out;
    save_norm(ctx, normalized_shape, {input, mean, rstd}, {weight, bias});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    auto [dx, dweight, dbias] = norm_grads(ctx, NormKind::Layer, grads[0], std::nullopt);
    return {dx, {}, dweight, dbias, {}};
  }
};

struct RmsNormFunction {
  static constexpr const char* kName = "fastreduce::RmsNormBackward";
  static Tensors2 op_call(const at::Tensor& input, at::IntArrayRef normalized_shape,
                          const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    return call_rms_norm(input, normalized_shape, weight, eps);
  }
  static void save(NodeContext* ctx, const Tensors2& out, const at::Tensor& input, at::IntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight, std::optional<double>) {
    save_norm(ctx, normalized_shape, {input, std::get<1>(out)}, {weight});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    auto [dx, dweight, dbias] = norm_grads(ctx, NormKind::Rms, grads[0], std::nullopt);
    return {dx, {}, dweight, {}};
  }
};

// The fused residual add: the gradient reaching residual_out joins the norm's
// input gradient in the backward kernel, and the sum is the gradient of both
// input and residual. Gradients are not materialised: an unused residual_out
// adds nothing (a zero gradient cost a fill and a read of the rows); an
// unused output is a zero grad_out.
Tensors3 add_norm_grads(NodeContext* ctx, NormKind kind, const variable_list& grads) {
  const at::Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(ctx->get_saved_variables()[0]);
  return norm_grads(ctx, kind, grad_out, or_none(grads[1]));
}

struct AddLayerNormFunction {
  using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
  static constexpr const char* kName = "fastreduce::AddLayerNormBackward";
  static Outputs op_call(const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
    return call_add_layer_norm(input, residual, normalized_shape, weight, bias, eps);
  }
  static void save(NodeContext* ctx, const Outputs& out, const at::Tensor&, const at::Tensor&,
                   at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                   const std::optional<at::Tensor>& bias, double) {
    const auto& [y, residual_out, mean, rstd] = out;
    ctx->set_materialize_grads(false);
    save_norm(ctx, normalized_shape, {residual_out, mean, rstd}, {weight, bias});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    auto [dx, dweight, dbias] = add_norm_grads(ctx, NormKind::Layer, grads);
    return {dx, dx, {}, dweight, dbias, {}};
  }
};

struct AddRmsNormFunction {
  static constexpr const char* kName = "fastreduce::AddRmsNormBackward";
  static Tensors3 op_call(const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
                          const std::optional<at::Tensor>& weight, std::optional<double> eps) {
    return call_add_rms_norm(input, residual, normalized_shape, weight, eps);
  }
  static void save(NodeContext* ctx, const Tensors3& out, const at::Tensor&, const at::Tensor&,
                   at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight, std::optional<double>) {
    const auto& [y, residual_out, rstd] = out;
    ctx->set_materialize_grads(false);
    save_norm(ctx, normalized_shape, {residual_out, rstd}, {weight});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    auto [dx, dweight, dbias] = add_norm_grads(ctx, NormKind::Rms, grads);
    return {dx, dx, {}, dweight, {}};
  }
};

// lse is differentiable too (z-loss: d lse / d x = softmax(x)). Gradients are
// not materialised: an unused loss or lse costs nothing in the backward.
struct CrossEntropyFunction {
  static constexpr const char* kName = "fastreduce::CrossEntropyBackward";
  static Tensors2 op_call(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
                          int64_t ignore_index, double label_smoothing) {
    return call_cross_entropy(input, target, reduction, ignore_index, label_smoothing);
  }
  static void save(NodeContext* ctx, const Tensors2& out, const at::Tensor& input, const at::Tensor& target,
                   c10::string_view reduction, int64_t ignore_index, double label_smoothing) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->save_for_backward({input, target, std::get<1>(out)});
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

struct SoftmaxFunction {
  static constexpr const char* kName = "fastreduce::SoftmaxBackward";
  static at::Tensor op_call(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
    return call_softmax(self, dim, dtype);
  }
  static void save(NodeContext* ctx, const at::Tensor& out, const at::Tensor& self, int64_t dim,
                   std::optional<at::ScalarType>) {
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["dtype"] = self.scalar_type();
    ctx->save_for_backward({out});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const at::Tensor dx = call_softmax_backward(grads[0], out, ctx->saved_data["dim"].toInt());
    return {dx.to(input_dtype(ctx)), {}, {}};
  }
};

struct CausalSoftmaxFunction {
  static constexpr const char* kName = "fastreduce::CausalSoftmaxBackward";
  static at::Tensor op_call(const at::Tensor& scores, double scale) { return call_causal_softmax(scores, scale); }
  static void save(NodeContext* ctx, const at::Tensor& out, const at::Tensor&, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({out});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    return {call_causal_softmax_backward(grads[0], out, ctx->saved_data["scale"].toDouble()), {}};
  }
};

// fused_linear_cross_entropy with reduction mean or sum: the forward already
// computed the loss's gradients (a copy of grad_weight would be the largest
// allocation of the step); the backward scales them (scale_once). lse has no
// gradient here.
struct FusedLinearCrossEntropyFunction {
  using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
  static constexpr const char* kName = "fastreduce::FusedLinearCrossEntropyBackward";
  static Outputs op_call(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                         const std::optional<at::Tensor>& bias, c10::string_view reduction, int64_t ignore_index,
                         double label_smoothing, std::optional<double> softcap) {
    return call_fused_linear_cross_entropy_with_grads(hidden, weight, target, bias, reduction, ignore_index,
                                                      label_smoothing, softcap);
  }
  static void save(NodeContext* ctx, const Outputs& out, const at::Tensor&, const at::Tensor&,
                   const at::Tensor& target, const std::optional<at::Tensor>& bias, c10::string_view,
                   int64_t ignore_index, double, std::optional<double>) {
    const auto& [loss, lse, grad_hidden, grad_weight, grad_bias] = out;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    save_to_scale(ctx, target, ignore_index, {grad_hidden, grad_weight, grad_bias});
    ctx->mark_non_differentiable({lse, grad_hidden, grad_weight, grad_bias});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    auto saved = scale_once(ctx, grads[0], "fused_linear_cross_entropy");
    return {saved[0], saved[1], {}, ctx->saved_data["has_bias"].toBool() ? saved[2] : at::Tensor(), {}, {}, {}, {}};
  }
};

// cross_entropy (mean or sum) whose gradient the forward computed from its
// one read of the logits: the Python wrapper and the C++ API take it when
// the loss will be differentiated and lse is not wanted. The backward
// scales it (scale_once).
struct CrossEntropyWithGradFunction {
  static constexpr const char* kName = "fastreduce::CrossEntropyBackward";
  static Tensors2 op_call(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
                          int64_t ignore_index, double label_smoothing) {
    return call_cross_entropy_with_grad(input, target, reduction, ignore_index, label_smoothing);
  }
  static void save(NodeContext* ctx, const Tensors2& out, const at::Tensor&, const at::Tensor& target,
                   c10::string_view, int64_t ignore_index, double) {
    const auto& [loss, grad] = out;
    save_to_scale(ctx, target, ignore_index, {grad});
    ctx->mark_non_differentiable({grad});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    return {scale_once(ctx, grads[0], "cross_entropy")[0], {}, {}, {}, {}};
  }
};

// The same with the gradient written over the logits
// (cross_entropy(..., inplace_backward=True)): the logits' version moves on,
// so a node that saved them refuses to run on what is now the gradient.
struct CrossEntropyGradOverLogitsFunction {
  static constexpr const char* kName = "fastreduce::CrossEntropyBackward";
  static at::Tensor op_call(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
                            int64_t ignore_index, double label_smoothing) {
    at::Tensor loss = call_cross_entropy_with_grad_inplace(input, target, reduction, ignore_index, label_smoothing);
    torch::autograd::impl::bump_version(input);
    return loss;
  }
  static void save(NodeContext* ctx, const at::Tensor&, const at::Tensor& input, const at::Tensor& target,
                   c10::string_view, int64_t ignore_index, double) {
    save_to_scale(ctx, target, ignore_index, {input});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    return {scale_once(ctx, grads[0], "cross_entropy")[0], {}, {}, {}, {}};
  }
};

// Reduction none: each row's gradient differs, so the backward recomputes
// the chunks' logits.
struct FusedLinearCrossEntropyRowsFunction {
  static constexpr const char* kName = "fastreduce::FusedLinearCrossEntropyBackward";
  static Tensors2 op_call(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                          const std::optional<at::Tensor>& bias, c10::string_view reduction, int64_t ignore_index,
                          double label_smoothing, std::optional<double> softcap) {
    return call_fused_linear_cross_entropy(hidden, weight, target, bias, reduction, ignore_index, label_smoothing,
                                           softcap);
  }
  static void save(NodeContext* ctx, const Tensors2& out, const at::Tensor& hidden, const at::Tensor& weight,
                   const at::Tensor& target, const std::optional<at::Tensor>& bias, c10::string_view reduction,
                   int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->saved_data["softcap"] = softcap.has_value() ? c10::IValue(*softcap) : c10::IValue();
    ctx->save_for_backward({hidden, weight, target, or_undefined(bias), std::get<1>(out)});
    ctx->mark_non_differentiable({std::get<1>(out)});
  }
  static variable_list backward(NodeContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& softcap = ctx->saved_data["softcap"];
    auto [grad_hidden, grad_weight, grad_bias] = call_fused_linear_cross_entropy_backward(
        grads[0], saved[0], saved[1], saved[2], or_none(saved[3]), saved[4],
        ctx->saved_data["reduction"].toStringRef(), ctx->saved_data["ignore_index"].toInt(),
        ctx->saved_data["label_smoothing"].toDouble(),
        softcap.isNone() ? std::nullopt : std::optional<double>(softcap.toDouble()));
    return {grad_hidden, grad_weight, {}, saved[3].defined() ? grad_bias : at::Tensor(), {}, {}, {}, {}};
  }
};

Tensors2 fused_linear_cross_entropy_autograd(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                             c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                             std::optional<double> softcap) {
  if (reduction == "none" || !any_wants_grad(hidden, weight, bias))
    return Autograd<FusedLinearCrossEntropyRowsFunction>::kernel(hidden, weight, target, bias, reduction,
                                                                 ignore_index, label_smoothing, softcap);
  const auto out = OpFunction<FusedLinearCrossEntropyFunction>::apply(hidden, weight, target, bias, reduction,
                                                                      ignore_index, label_smoothing, softcap);
  return {std::get<0>(out), std::get<1>(out)};
}

}  // namespace

void register_autograd(torch::Library& m) {
  m.impl("sum", &Autograd<SumMeanFunction<false>>::kernel);
  m.impl("mean", &Autograd<SumMeanFunction<true>>::kernel);
  m.impl("prod", &Autograd<ProdFunction>::kernel);
  m.impl("amax", &Autograd<ExtremumFunction<true>>::kernel);
  m.impl("amin", &Autograd<ExtremumFunction<false>>::kernel);
  m.impl("layer_norm", &Autograd<LayerNormFunction>::kernel);
  m.impl("rms_norm", &Autograd<RmsNormFunction>::kernel);
  m.impl("add_layer_norm", &Autograd<AddLayerNormFunction>::kernel);
  m.impl("add_rms_norm", &Autograd<AddRmsNormFunction>::kernel);
  m.impl("cross_entropy", &Autograd<CrossEntropyFunction>::kernel);
  m.impl("_cross_entropy_with_grad", &Autograd<CrossEntropyWithGradFunction>::kernel);
  m.impl("_cross_entropy_with_grad_", &Autograd<CrossEntropyGradOverLogitsFunction>::kernel);
  m.impl("softmax", &Autograd<SoftmaxFunction>::kernel);
  m.impl("causal_softmax", &Autograd<CausalSoftmaxFunction>::kernel);
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy_autograd);
  register_statistics_autograd(m);
}

}  // namespace fastreduce
