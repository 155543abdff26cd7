// layer_norm, rms_norm (each also fused with the residual add), softmax and
// causal_softmax: argument checks, shapes and the (rows, n) view the kernels
// take; the CPU and CUDA backends do the rest.
#include "norm_args.h"

#include <c10/core/DeviceGuard.h>

#include <limits>

#include "common.h"
#include "kernels.h"
#include "ops.h"

namespace fastreduce {

void check_floating(const at::Tensor& t, const char* op, const char* argument) {
  const auto type = t.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16, op,
              ": unsupported dtype ", to_text(type), " for argument '", argument, "'; expected a floating dtype");
}

bool is_half_type(at::ScalarType type) { return type == at::kHalf || type == at::kBFloat16; }

// Parameters match the input's dtype, or are float32 beside float16/bfloat16
// activations (mixed precision), as torch accepts.
static void check_param(const std::optional<at::Tensor>& param, const at::Tensor& input, at::IntArrayRef normalized_shape,
                 const char* op, const char* argument) {
  if (!param.has_value() || !param->defined()) return;
  check_same_device(*param, input, op, argument, "input");
  const bool mixed = param->scalar_type() == at::kFloat && is_half_type(input.scalar_type());
  TORCH_CHECK(param->scalar_type() == input.scalar_type() || mixed, op, ": argument '", argument, "' has dtype ",
              to_text(param->scalar_type()), " but 'input' has dtype ", to_text(input.scalar_type()),
              "; expected the same dtype, or float32 parameters with float16/bfloat16 input");
  TORCH_CHECK(param->sizes() == normalized_shape, op, ": argument '", argument, "' has shape ", to_text(param->sizes()),
              " but normalized_shape is ", to_text(normalized_shape));
}

const at::Tensor* defined_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? &*t : nullptr;
}

// Each parameter as check_param; both in one dtype, as torch requires.
void check_params(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                  const at::Tensor& input, at::IntArrayRef normalized_shape, const char* op) {
  check_param(weight, input, normalized_shape, op, "weight");
  check_param(bias, input, normalized_shape, op, "bias");
  const at::Tensor* w = defined_or_null(weight);
  const at::Tensor* b = defined_or_null(bias);
  if (w && b)
    TORCH_CHECK(w->scalar_type() == b->scalar_type(), op, ": argument 'bias' has dtype ", to_text(b->scalar_type()),
                " but 'weight' has dtype ", to_text(w->scalar_type()), "; expected the same dtype");
}

bool has_float_param(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias) {
  const at::Tensor* w = defined_or_null(weight);
  const at::Tensor* b = defined_or_null(bias);
  return (w && w->scalar_type() != input.scalar_type()) || (b && b->scalar_type() != input.scalar_type());
}

at::Tensor kernel_param(const std::optional<at::Tensor>& t) {
  const at::Tensor* defined = defined_or_null(t);
  return defined ? defined->contiguous() : at::Tensor();
}

namespace {

void check_like(const at::Tensor& t, const at::Tensor& reference, const char* op, const char* argument,
                const char* reference_name) {
  check_same_device(t, reference, op, argument, reference_name);
  TORCH_CHECK(t.scalar_type() == reference.scalar_type(), op, ": argument '", argument, "' has dtype ",
              to_text(t.scalar_type()), " but '", reference_name, "' has dtype ", to_text(reference.scalar_type()));
}

void check_same_shape(const at::Tensor& t, const at::Tensor& reference, const char* op, const char* argument,
                      const char* reference_name) {
  TORCH_CHECK(t.sizes() == reference.sizes(), op, ": argument '", argument, "' has shape ", to_text(t.sizes()), " but '",
              reference_name, "' has shape ", to_text(reference.sizes()));
}

// Rows and row length of a layer_norm over the trailing `normalized_shape`.
std::pair<int64_t, int64_t> layer_norm_rows(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                            const char* op) {
  const int64_t k = normalized_shape.size();
  TORCH_CHECK(k >= 1, op, ": argument 'normalized_shape' must have at least one dimension");
  TORCH_CHECK(input.dim() >= k && input.sizes().slice(input.dim() - k) == normalized_shape, op,
              ": argument 'normalized_shape' is ", to_text(normalized_shape), ", expected input with shape [*, ",
              to_text(normalized_shape).substr(1), ", but got input of size ", to_text(input.sizes()));
  return {c10::multiply_integers(input.sizes().slice(0, input.dim() - k)), c10::multiply_integers(normalized_shape)};
}

// mean/rstd in aten's shape (*leading, 1, ..., 1), of `type`.
at::Tensor stats_tensor(const at::Tensor& input, int64_t k, at::ScalarType type) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end() - k);
  shape.insert(shape.end(), k, 1);
  return at::empty(shape, input.options().dtype(type));
}

// The dtype of the statistics a forward returns: the accumulator's on CUDA,
// beside float32 parameters and for rms_norm (no aten contract to follow,
// and its backward is sensitive to a rounded rstd); the input's otherwise,
// as aten's CPU layer_norm.
at::ScalarType returned_stats_type(const at::Tensor& input, bool widen) {
  return widen || input.is_cuda() ? acc_type(input) : input.scalar_type();
}

// A norm as an op names it: the name errors carry, and its kind.
struct NormOp {
  const char* name;
  NormKind kind;
  bool centered() const { return kind == NormKind::Layer; }
};

struct NormForwardResult {
  at::Tensor y, residual_out, mean, rstd;
};

// The parameter and residual checks, the outputs, and the backend call of a
// forward of any of the four norms. The kernels keep the statistics in the
// accumulator type; they are returned in aten's dtype.
NormForwardResult norm_forward(NormOp kind, const at::Tensor& input, const at::Tensor* residual,
                               at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
  const char* op = kind.name;
  check_floating(input, op, "input");
  at::Tensor x = input.contiguous(), added;
  NormForwardResult r;
  if (residual) {
    check_floating(*residual, op, "residual");
    check_same_device(*residual, input, op, "residual", "input");
    check_same_shape(*residual, input, op, "residual", "input");
    // Mixed dtypes promote as torch's add would (a float32 residual stream
    // beside bfloat16 sublayer outputs under autocast): both are cast first.
    const auto type = at::promote_types(input.scalar_type(), residual->scalar_type());
    x = in_type(x, type);
    added = in_type(*residual, type).contiguous();
    r.residual_out = empty_as(x);
  }
  check_params(weight, bias, x, normalized_shape, op);
  const auto [rows, n] = layer_norm_rows(input, normalized_shape, op);
  r.y = empty_as(x);
  at::Tensor rstd = stats_tensor(x, normalized_shape.size(), acc_type(x));
  at::Tensor mean = kind.centered() ? empty_as(rstd) : at::Tensor();
  const at::Tensor w = kernel_param(weight), b = kernel_param(bias);
  const bool float_params = has_float_param(x, weight, bias);
  if (n == 0) {  // rows of no elements: aten's statistics (mean 0, rstd NaN), nothing to normalise
    rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    if (mean.defined()) mean.zero_();
    if (residual) r.residual_out.copy_(x);
  } else {
    const NormShape shape{to_dtype(x.scalar_type(), op), rows, n, kind.kind, op, float_params};
    const NormForwardBuffers<> io{x.const_data_ptr(), data_or_null(added),          data_or_null(w),
                                  data_or_null(b),    r.y.data_ptr(),               mutable_or_null(r.residual_out),
                                  mutable_or_null(mean), rstd.data_ptr()};
    const c10::DeviceGuard guard(x.device());
    norm_forward_stub(x.device().type(), shape, io, eps);
  }
  const auto type = returned_stats_type(x, float_params || !kind.centered());
  r.rstd = in_type(rstd, type);
  if (mean.defined()) r.mean = in_type(mean, type);
  return r;
}

// rms_norm's default eps, as torch: the machine epsilon of the accumulator type.
double default_eps(at::ScalarType type, std::optional<double> eps) {
  if (eps.has_value()) return *eps;
  return type == at::kDouble ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

// dx (with grad_residual added when given), and the weight and bias
// gradients of the parameters that exist (undefined for the others).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(
    NormOp kind, const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
    const at::Tensor* mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& grad_residual) {
  const char* op = kind.name;
  check_floating(input, op, "input");
  check_like(grad_out, input, op, "grad_out", "input");
  check_same_shape(grad_out, input, op, "grad_out", "input");
  const at::Tensor* carried = defined_or_null(grad_residual);
  if (carried) {
    check_like(*carried, input, op, "grad_residual", "input");
    check_same_shape(*carried, input, op, "grad_residual", "input");
  }
  check_params(weight, bias, input, normalized_shape, op);
  const auto [rows, n] = layer_norm_rows(input, normalized_shape, op);
  TORCH_CHECK(rstd.numel() == rows && (!mean || mean->numel() == rows), op, ": the statistics need ", to_text(rows),
              " elements each, got ", to_text(rstd.numel()));
  check_same_device(rstd, input, op, "rstd", "input");
  if (mean) check_same_device(*mean, input, op, "mean", "input");
  const at::Tensor* w = defined_or_null(weight);
  const at::Tensor* b = defined_or_null(bias);
  const at::Tensor dy = grad_out.contiguous(), x = input.contiguous();
  const at::Tensor carried_rows = carried ? carried->contiguous() : at::Tensor();
  // The kernels take the statistics in the accumulator type.
  const auto acc = acc_type(input);
  const at::Tensor mean_acc = mean ? in_type(*mean, acc).contiguous() : at::Tensor();
  const at::Tensor rstd_acc = in_type(rstd, acc).contiguous();
  const at::Tensor kernel_weight = kernel_param(weight);
  at::Tensor dx = empty_as(x);
  // The kernels write each gradient in its parameter's dtype; layer_norm's
  // make dweight and dbias when either parameter exists (the absent one's in
  // the accumulator type, unused).
  auto grad_for = [&](const at::Tensor* param) {
    return at::empty(normalized_shape, input.options().dtype(param ? param->scalar_type() : acc));
  };
  at::Tensor dweight = w || b ? grad_for(w) : at::Tensor();
  at::Tensor dbias = kind.centered() && (w || b) ? grad_for(b) : at::Tensor();
  if (rows > 0 && n > 0) {
    const NormShape shape{to_dtype(x.scalar_type(), op), rows, n, kind.kind, op, has_float_param(x, weight, bias)};
    const NormBackwardBuffers<> io{dy.const_data_ptr(),       x.const_data_ptr(),       data_or_null(carried_rows),
                                   data_or_null(mean_acc),    rstd_acc.const_data_ptr(), data_or_null(kernel_weight),
                                   dx.data_ptr()};
    const NormParamGrads grads{mutable_or_null(dweight), mutable_or_null(dbias),
                               dweight.defined() && dweight.scalar_type() == x.scalar_type(),
                               dbias.defined() && dbias.scalar_type() == x.scalar_type()};
    const c10::DeviceGuard guard(x.device());
    norm_backward_stub(x.device().type(), shape, io, grads);
  } else {  // no rows, or rows of no elements: zero parameter gradients
    if (dweight.defined()) dweight.zero_();
    if (dbias.defined()) dbias.zero_();
  }
  return {dx, w ? dweight : at::Tensor(), b ? dbias : at::Tensor()};
}

// The schemas return an empty tensor for an absent parameter's gradient.
at::Tensor or_empty(const at::Tensor& grad, const at::Tensor& input) {
  return grad.defined() ? grad : input.new_empty({0});
}

constexpr NormOp kLayerNorm{"layer_norm", NormKind::Layer}, kAddLayerNorm{"add_layer_norm", NormKind::Layer};
constexpr NormOp kRmsNorm{"rms_norm", NormKind::Rms}, kAddRmsNorm{"add_rms_norm", NormKind::Rms};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> backend::layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  NormForwardResult t = norm_forward(kLayerNorm, input, nullptr, normalized_shape, weight, bias, eps);
  return {t.y, t.mean, t.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backend::layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& grad_residual) {
  const NormOp kind{"layer_norm_backward", NormKind::Layer};
  auto [dx, dw, db] = norm_backward(kind, grad_out, input, normalized_shape, &mean, rstd, weight, bias, grad_residual);
  return {dx, or_empty(dw, input), or_empty(db, input)};
}

std::tuple<at::Tensor, at::Tensor> backend::rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                     const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  NormForwardResult t =
      norm_forward(kRmsNorm, input, nullptr, normalized_shape, weight, std::nullopt,
                   default_eps(input.scalar_type(), eps));
  return {t.y, t.rstd};
}

std::tuple<at::Tensor, at::Tensor> backend::rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                              at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& grad_residual) {
  const NormOp kind{"rms_norm_backward", NormKind::Rms};
  auto [dx, dw, db] =
      norm_backward(kind, grad_out, input, normalized_shape, nullptr, rstd, weight, std::nullopt, grad_residual);
  return {dx, or_empty(dw, input)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backend::add_layer_norm(
    const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  NormForwardResult t = norm_forward(kAddLayerNorm, input, &residual, normalized_shape, weight, bias, eps);
  return {t.y, t.residual_out, t.mean, t.rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backend::add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                                     at::IntArrayRef normalized_shape,
                                                                     const std::optional<at::Tensor>& weight,
                                                                     std::optional<double> eps) {
  // eps=None: the epsilon of the sum's dtype (float64 when either is), as rms_norm of input + residual.
  const auto sum_type = at::promote_types(input.scalar_type(), residual.scalar_type());
  NormForwardResult t = norm_forward(kAddRmsNorm, input, &residual, normalized_shape, weight, std::nullopt,
                                      default_eps(sum_type, eps));
  return {t.y, t.residual_out, t.rstd};
}

namespace {

// Softmax over the last dim of a contiguous tensor; other dims are moved last
// with one copy and moved back.
at::Tensor rowwise(const at::Tensor& t, int64_t dim) {
  return dim == t.dim() - 1 ? t.contiguous() : t.movedim(dim, -1).contiguous();
}

at::Tensor from_rowwise(const at::Tensor& t, int64_t dim) {
  return dim == t.dim() - 1 ? t : t.movedim(-1, dim).contiguous();
}

SoftmaxShape softmax_shape(const at::Tensor& rows, int64_t causal, double scale, const char* op) {
  const int64_t n = rows.dim() == 0 ? 1 : rows.size(-1);
  return {to_dtype(rows.scalar_type(), op), n == 0 ? 0 : rows.numel() / n, n, causal, scale, op};
}

at::Tensor softmax_rows(const at::Tensor& x, int64_t causal, double scale) {
  at::Tensor y = empty_as(x);
  const SoftmaxShape shape = softmax_shape(x, causal, scale, "softmax");
  const SoftmaxForwardBuffers io{x.const_data_ptr(), y.data_ptr()};
  const c10::DeviceGuard guard(x.device());
  softmax_forward_stub(x.device().type(), shape, io);
  return y;
}

at::Tensor softmax_backward_rows(const at::Tensor& dy, const at::Tensor& y, int64_t causal, double scale) {
  at::Tensor dx = empty_as(y);
  const SoftmaxShape shape = softmax_shape(y, causal, scale, "softmax_backward");
  const SoftmaxBackwardBuffers io{dy.const_data_ptr(), y.const_data_ptr(), dx.data_ptr()};
  const c10::DeviceGuard guard(y.device());
  softmax_backward_stub(y.device().type(), shape, io);
  return dx;
}

void check_scores(const at::Tensor& scores, const char* op, const char* argument) {
  check_floating(scores, op, argument);
  TORCH_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2), op, ": argument '", argument,
              "' must have shape (..., T, T), got ", to_text(scores.sizes()));
}

}  // namespace

at::Tensor backend::softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  const at::Tensor x = dtype.has_value() ? self.to(*dtype) : self;
  check_floating(x, "softmax", "self");
  const int64_t d = wrap_dim(dim, x.dim());
  if (x.dim() == 0) return softmax_rows(x.contiguous(), 0, 1.0);
  return from_rowwise(softmax_rows(rowwise(x, d), 0, 1.0), d);
}

at::Tensor backend::softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim) {
  const char* op = "softmax_backward";
  check_floating(output, op, "output");
  check_like(grad_output, output, op, "grad_output", "output");
  check_same_shape(grad_output, output, op, "grad_output", "output");
  const int64_t d = wrap_dim(dim, output.dim());
  if (output.dim() == 0) return softmax_backward_rows(grad_output.contiguous(), output.contiguous(), 0, 1.0);
  return from_rowwise(softmax_backward_rows(rowwise(grad_output, d), rowwise(output, d), 0, 1.0), d);
}

at::Tensor backend::causal_softmax(const at::Tensor& scores, double scale) {
  check_scores(scores, "causal_softmax", "scores");
  return softmax_rows(scores.contiguous(), scores.size(-1), scale);
}

at::Tensor backend::causal_softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, double scale) {
  const char* op = "causal_softmax_backward";
  check_scores(output, op, "output");
  check_like(grad_output, output, op, "grad_output", "output");
  check_same_shape(grad_output, output, op, "grad_output", "output");
  return softmax_backward_rows(grad_output.contiguous(), output.contiguous(), output.size(-1), scale);
}

}  // namespace fastreduce
