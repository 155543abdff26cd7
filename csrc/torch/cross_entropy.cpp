// cross_entropy: argument checks and outputs; the CPU and CUDA backends do
// the rest.
#include <c10/core/DeviceGuard.h>

#include <limits>

#include "common.h"
#include "dispatch.h"
#include "kernels.h"
#include "ops.h"

namespace fastreduce {
namespace {

int reduction_code(c10::string_view reduction, const char* op) {
  if (reduction == "none") return 0;
  if (reduction == "mean") return 1;
  if (reduction == "sum") return 2;
  TORCH_CHECK(false, op, ": argument 'reduction' is '", std::string(reduction),
              "'; expected 'none', 'mean' or 'sum'");
}

CrossEntropyShape check_problem(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
                               int64_t ignore_index, double label_smoothing, const char* op) {
  const auto type = input.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16, op,
              ": unsupported dtype ", to_text(type), " for argument 'input'; expected a floating dtype");
  TORCH_CHECK(input.dim() == 2, op, ": argument 'input' must be (N, C) logits, got shape ", to_text(input.sizes()));
  TORCH_CHECK(target.scalar_type() == at::kLong, op, ": argument 'target' must hold int64 class indices, got ",
              to_text(target.scalar_type()));
  TORCH_CHECK(target.dim() == 1 && target.size(0) == input.size(0), op, ": argument 'target' must have shape (",
              to_text(input.size(0)), ",), got ", to_text(target.sizes()));
  check_same_device(target, input, op, "target", "input");
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
              ": argument 'label_smoothing' must be in [0, 1]");
  TORCH_CHECK(input.size(1) > 0 || input.size(0) == 0, op, ": argument 'input' has no classes");
  return {to_dtype(type, op), input.size(0), input.size(1), input.size(1), ignore_index, label_smoothing,
          reduction_code(reduction, op), op};
}

// Whether each row of the (N, C) logits is contiguous, rows apart (a view of wider rows too).
bool has_unit_rows(const at::Tensor& logits) {
  return (logits.size(1) <= 1 || logits.stride(1) == 1) && (logits.size(0) <= 1 || logits.stride(0) >= logits.size(1));
}

// Elements from one row to the next, as the kernels read them.
int64_t row_stride(const at::Tensor& logits) { return logits.size(0) > 1 ? logits.stride(0) : logits.size(1); }

// The logits as the kernels read them: themselves where their rows are contiguous, else a contiguous copy.
at::Tensor with_unit_rows(const at::Tensor& input) { return has_unit_rows(input) ? input : input.contiguous(); }

}  // namespace

std::tuple<at::Tensor, at::Tensor> backend::cross_entropy(const at::Tensor& input, const at::Tensor& target,
                                                          c10::string_view reduction, int64_t ignore_index,
                                                          double label_smoothing) {
  CrossEntropyShape shape = check_problem(input, target, reduction, ignore_index, label_smoothing, "cross_entropy");
  const at::Tensor logits = with_unit_rows(input), targets = target.contiguous();
  shape.row_stride = row_stride(logits);
  at::Tensor loss = shape.reduction == 0 ? at::empty({shape.rows}, input.options()) : at::empty({}, input.options());
  at::Tensor lse = at::empty({shape.rows}, input.options().dtype(acc_type(input)));
  const c10::DeviceGuard guard(input.device());
  cross_entropy_forward_stub(input.device().type(), shape,
                             {logits.const_data_ptr(), targets.const_data_ptr<int64_t>(), loss.data_ptr(),
                              lse.data_ptr()});
  return {loss, lse};
}

void cross_entropy_backward_into(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                 const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                 c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                 at::Tensor& grad_input) {
  const char* op = "cross_entropy_backward";
  CrossEntropyShape shape = check_problem(input, target, reduction, ignore_index, label_smoothing, op);
  TORCH_CHECK(grad_loss.numel() == (shape.reduction == 0 ? shape.rows : 1), op, ": argument 'grad_loss' has ",
              to_text(grad_loss.numel()), " elements, expected one per row for reduction 'none', else one");
  TORCH_CHECK(lse.numel() == shape.rows, op, ": argument 'lse' needs one element per row");
  const bool has_grad_lse = grad_lse.has_value() && grad_lse->defined();
  check_same_device(grad_loss, input, op, "grad_loss", "input");
  check_same_device(lse, input, op, "lse", "input");
  if (has_grad_lse) check_same_device(*grad_lse, input, op, "grad_lse", "input");
  const at::Tensor acc_lse = lse.to(acc_type(input)).contiguous();
  const at::Tensor acc_grad_lse = has_grad_lse ? grad_lse->to(acc_type(input)).contiguous() : at::Tensor();
  TORCH_CHECK(has_unit_rows(grad_input) && grad_input.sizes() == input.sizes() &&
                  grad_input.scalar_type() == input.scalar_type(),
              op, ": the gradient buffer must have the logits' shape and dtype, its rows contiguous");
  // The logits read in place where their rows are laid out as the gradient's (the same buffer when in place).
  const at::Tensor logits =
      has_unit_rows(input) && row_stride(input) == row_stride(grad_input) ? input : input.contiguous();
  shape.row_stride = row_stride(grad_input);
  TORCH_CHECK(row_stride(logits) == shape.row_stride, op, ": the gradient buffer's rows must be laid out as the logits'");
  const at::Tensor grad = grad_loss.to(input.scalar_type()).contiguous(), targets = target.contiguous();
  const c10::DeviceGuard guard(input.device());
  cross_entropy_backward_stub(input.device().type(), shape,
                              {grad.const_data_ptr(), data_or_null(acc_grad_lse),
                               logits.const_data_ptr(), targets.const_data_ptr<int64_t>(), acc_lse.const_data_ptr(),
                               grad_input.data_ptr()});
}

at::Tensor backend::cross_entropy_backward(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                           const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                           c10::string_view reduction, int64_t ignore_index, double label_smoothing) {
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  cross_entropy_backward_into(grad_loss, grad_lse, input, target, lse, reduction, ignore_index, label_smoothing,
                              grad_input);
  return grad_input;
}

void backend::cross_entropy_backward_inplace(const at::Tensor& input, const at::Tensor& grad_loss,
                                             const std::optional<at::Tensor>& grad_lse, const at::Tensor& target,
                                             const at::Tensor& lse, c10::string_view reduction, int64_t ignore_index,
                                             double label_smoothing) {
  TORCH_CHECK(input.is_contiguous(), "_cross_entropy_backward_: argument 'input' must be contiguous (the gradient is "
                                     "written over it)");
  at::Tensor grad_input = input;
  cross_entropy_backward_into(grad_loss, grad_lse, input, target, lse, reduction, ignore_index, label_smoothing,
                              grad_input);
}

// Each row's loss in the accumulator type, from its log-sum-exp (the
// CPU's cross_entropy gives them in the logits' dtype):
// (1 - eps) (lse - z_target) + eps (lse - mean z), 0 on ignored rows; NaN
// on a row holding +inf (lse +inf), as torch's log_softmax there.
at::Tensor cross_entropy_row_losses(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& row_lse,
                                    int64_t ignore_index, double label_smoothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor lse = at::where(at::isposinf(row_lse), nan, row_lse);
  const at::Tensor kept = target != ignore_index;
  // A class outside [0, classes) reads class 0 and gives NaN: no host check (a sync), no device assert.
  const at::Tensor in_range = target.ge(0).logical_and(target.lt(logits.size(1)));
  const at::Tensor index = at::where(kept.logical_and(in_range), target, at::zeros({}, target.options())).unsqueeze(1);
  at::Tensor loss = (lse - logits.gather(1, index).squeeze(1).to(lse.scalar_type())) * (1.0 - label_smoothing);
  if (label_smoothing > 0.0) loss += (lse - call_mean(logits, at::IntArrayRef{1}, false, lse.scalar_type())) * label_smoothing;
  return at::where(kept, at::where(in_range, loss, nan), at::zeros({}, loss.options()));
}

void cross_entropy_with_grad_rows(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& grad_scale,
                                  bool mean, const at::Tensor& lse, const at::Tensor& row_loss, const at::Tensor& loss,
                                  at::Tensor& grad_input, int64_t ignore_index, double label_smoothing,
                                  const char* op) {
  TORCH_CHECK(has_unit_rows(logits) && row_stride(grad_input) == row_stride(logits), op,
              ": the logits' rows must be contiguous, the gradient's laid out as theirs");
  const CrossEntropyShape shape{to_dtype(logits.scalar_type(), op), logits.size(0), logits.size(1),
                                row_stride(logits), ignore_index, label_smoothing, mean ? 1 : 2, op};
  const c10::DeviceGuard guard(logits.device());
  cross_entropy_with_grad_stub(logits.device().type(), shape,
                               {logits.const_data_ptr(), target.const_data_ptr<int64_t>(),
                                data_or_null(grad_scale), mutable_or_null(lse), mutable_or_null(row_loss),
                                mutable_or_null(loss), grad_input.data_ptr()});
}

namespace {

// The loss, its gradient written into grad_input (which may be the logits).
at::Tensor with_grad_into(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
                          int64_t ignore_index, double label_smoothing, at::Tensor& grad_input, const char* op) {
  const CrossEntropyShape shape = check_problem(input, target, reduction, ignore_index, label_smoothing, op);
  TORCH_CHECK(shape.reduction != 0, op, ": the gradient in the forward needs reduction 'mean' or 'sum'");
  const bool mean = shape.reduction == 1;
  // No rows, none kept: the mean is 0 / 0 = NaN, as torch.
  if (shape.rows == 0) return at::full({}, mean ? std::numeric_limits<double>::quiet_NaN() : 0.0, input.options());
  at::Tensor loss = at::empty({}, input.options());
  cross_entropy_with_grad_rows(input, target.contiguous(), at::Tensor(), mean, at::Tensor(), at::Tensor(), loss,
                               grad_input, ignore_index, label_smoothing, op);
  return loss;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> backend::cross_entropy_with_grad(const at::Tensor& input, const at::Tensor& target,
                                                                    c10::string_view reduction, int64_t ignore_index,
                                                                    double label_smoothing) {
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor loss = with_grad_into(input.contiguous(), target, reduction, ignore_index, label_smoothing, grad_input,
                                   "_cross_entropy_with_grad");
  return {loss, grad_input};
}

at::Tensor backend::cross_entropy_with_grad_inplace(const at::Tensor& input, const at::Tensor& target,
                                                    c10::string_view reduction, int64_t ignore_index,
                                                    double label_smoothing) {
  TORCH_CHECK(input.is_contiguous(), "_cross_entropy_with_grad_: argument 'input' must be contiguous (the gradient "
                                     "is written over it)");
  at::Tensor grad_input = input;
  return with_grad_into(input, target, reduction, ignore_index, label_smoothing, grad_input,
                        "_cross_entropy_with_grad_");
}

void backend::scale_unless_one(const at::Tensor& self, const at::Tensor& factor,
                               const std::optional<at::Tensor>& target, int64_t ignore_index, bool per_row) {
  const char* op = "_scale_unless_one_";
  TORCH_CHECK(self.is_contiguous(), op, ": argument 'self' must be contiguous");
  TORCH_CHECK(factor.numel() == 1, op, ": argument 'factor' must hold one element, got ", to_text(factor.numel()));
  check_same_device(factor, self, op, "factor", "self");
  ScaleProblem problem{to_dtype(self.scalar_type(), op), self.data_ptr(), 1, self.numel()};
  at::Tensor targets;
  if (target.has_value() && target->defined()) {
    TORCH_CHECK(target->scalar_type() == at::kLong, op, ": argument 'target' must hold int64 class indices, got ",
                to_text(target->scalar_type()));
    TORCH_CHECK(target->dim() == 1, op, ": argument 'target' must be 1-D, got shape ", to_text(target->sizes()));
    check_same_device(*target, self, op, "target", "self");
    targets = target->contiguous();
    problem.unscaled = Unscaled::kAllWhenAllIgnored;
    problem.target = targets.const_data_ptr<int64_t>();
    problem.target_count = targets.numel();
    problem.ignore_index = ignore_index;
  }
  if (per_row) {
    TORCH_CHECK(targets.defined(), op, ": argument 'per_row' needs argument 'target'");
    TORCH_CHECK(self.dim() >= 1 && self.size(0) == problem.target_count, op,
                ": argument 'target' must hold one element a row of 'self' (shape ", to_text(self.sizes()),
                "), got shape ", to_text(targets.sizes()));
    problem.unscaled = Unscaled::kIgnoredRows;
    problem.rows = problem.target_count;
    problem.width = problem.rows == 0 ? 0 : self.numel() / problem.rows;
  }
  // A factor of the data's dtype (a loss's incoming gradient) is read as it is: no conversion launched.
  problem.factor_of_data_type = factor.scalar_type() == self.scalar_type();
  const at::Tensor scale = problem.factor_of_data_type ? factor : factor.to(acc_type(self));
  problem.factor = scale.const_data_ptr();
  const c10::DeviceGuard guard(self.device());
  scale_unless_one_stub(self.device().type(), problem);
}

}  // namespace fastreduce
