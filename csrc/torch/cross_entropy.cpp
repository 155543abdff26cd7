// cross_entropy: argument checks and outputs; the CPU and CUDA backends do
// the rest.
#include "common.h"
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

CrossEntropyArgs check_problem(const at::Tensor& input, const at::Tensor& target, c10::string_view reduction,
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
  return {input.size(0), input.size(1), ignore_index, label_smoothing, reduction_code(reduction, op)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> backend::cross_entropy(const at::Tensor& input, const at::Tensor& target,
                                                          c10::string_view reduction, int64_t ignore_index,
                                                          double label_smoothing) {
  const CrossEntropyArgs args = check_problem(input, target, reduction, ignore_index, label_smoothing, "cross_entropy");
  const at::Tensor logits = input.contiguous(), targets = target.contiguous();
  at::Tensor loss = args.reduction == 0 ? at::empty({args.rows}, input.options()) : at::empty({}, input.options());
  at::Tensor lse = at::empty({args.rows}, input.options().dtype(acc_type(input)));
  if (input.is_cuda()) cross_entropy_forward_cuda(logits, targets, loss, lse, args);
  else cross_entropy_forward_cpu(logits, targets, loss, lse, args);
  return {loss, lse};
}

void cross_entropy_backward_into(const at::Tensor& grad_loss, const std::optional<at::Tensor>& grad_lse,
                                 const at::Tensor& input, const at::Tensor& target, const at::Tensor& lse,
                                 c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                 at::Tensor& grad_input) {
  const char* op = "cross_entropy_backward";
  const CrossEntropyArgs args = check_problem(input, target, reduction, ignore_index, label_smoothing, op);
  TORCH_CHECK(grad_loss.numel() == (args.reduction == 0 ? args.rows : 1), op, ": argument 'grad_loss' has ",
              to_text(grad_loss.numel()), " elements, expected one per row for reduction 'none', else one");
  TORCH_CHECK(lse.numel() == args.rows, op, ": argument 'lse' needs one element per row");
  const bool has_grad_lse = grad_lse.has_value() && grad_lse->defined();
  check_same_device(grad_loss, input, op, "grad_loss", "input");
  check_same_device(lse, input, op, "lse", "input");
  if (has_grad_lse) check_same_device(*grad_lse, input, op, "grad_lse", "input");
  const at::Tensor acc_lse = lse.to(acc_type(input)).contiguous();
  const at::Tensor acc_grad_lse = has_grad_lse ? grad_lse->to(acc_type(input)).contiguous() : at::Tensor();
  const at::Tensor logits = input.contiguous();
  TORCH_CHECK(grad_input.is_contiguous() && grad_input.sizes() == logits.sizes() &&
                  grad_input.scalar_type() == logits.scalar_type(),
              op, ": the gradient buffer must be contiguous, of the logits' shape and dtype");
  const at::Tensor grad = grad_loss.to(input.scalar_type()).contiguous();
  if (input.is_cuda())
    cross_entropy_backward_cuda(grad, acc_grad_lse, logits, target.contiguous(), acc_lse, grad_input, args);
  else
    cross_entropy_backward_cpu(grad, acc_grad_lse, logits, target.contiguous(), acc_lse, grad_input, args);
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

}  // namespace fastreduce
