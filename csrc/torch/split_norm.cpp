// A norm in two halves, for rows split across the ranks of a tensor-parallel
// group (fastreduce_torch/distributed.py): each rank reduces its slice of
// every row to (mean, variance), the ranks merge those (8 bytes a row), and
// each rank applies the merged statistics to its slice.
#include <c10/core/DeviceGuard.h>

#include <limits>

#include "common.h"
#include "kernels.h"
#include "norm_args.h"
#include "ops.h"
#include "reduction.h"

namespace fastreduce {
namespace {

void check_input(const at::Tensor& input, const char* op) {
  check_floating(input, op, "input");
  TORCH_CHECK(input.dim() >= 1, op, ": argument 'input' must have at least one dimension");
}

// A statistic of every row: shape input.shape[:-1], the accumulator dtype.
void check_statistic(const at::Tensor& t, const at::Tensor& input, const char* op, const char* argument) {
  check_same_device(t, input, op, argument, "input");
  TORCH_CHECK(t.scalar_type() == acc_type(input), op, ": argument '", argument, "' has dtype ",
              to_text(t.scalar_type()), ", expected ", to_text(acc_type(input)), " for input of dtype ",
              to_text(input.scalar_type()));
  TORCH_CHECK(t.sizes() == input.sizes().slice(0, input.dim() - 1), op, ": argument '", argument, "' has shape ",
              to_text(t.sizes()), ", expected ", to_text(input.sizes().slice(0, input.dim() - 1)));
}

}  // namespace

// var_mean over the last dim with correction 0, kept in the accumulator
// type (a bfloat16 mean would round away what the merge needs).
std::tuple<at::Tensor, at::Tensor> backend::row_moments(const at::Tensor& input) {
  const char* op = "_row_moments";
  check_input(input, op);
  const auto shape = input.sizes().slice(0, input.dim() - 1);
  const auto options = input.options().dtype(acc_type(input));
  if (input.numel() == 0) {
    const auto nan = at::full(shape, std::numeric_limits<double>::quiet_NaN(), options);
    return {nan, nan.clone()};
  }
  ReduceParams params;
  params.acc_outputs = true;
  std::bitset<kMaxDims> last;
  last.set(input.dim() - 1);
  auto [var, mean] = run_reduction(ReduceKind::Var, params, input, last, false, acc_type(input), true);
  return {mean, var};
}

// y = (input - mean) * rstd * weight + bias over the last dim; no mean:
// rms_norm's apply.
at::Tensor backend::normalize_rows(const at::Tensor& input, const std::optional<at::Tensor>& mean,
                                   const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& bias) {
  const char* op = "_normalize_rows";
  check_input(input, op);
  const bool centered = mean.has_value() && mean->defined();
  if (centered) check_statistic(*mean, input, op, "mean");
  check_statistic(rstd, input, op, "rstd");
  const at::Tensor x = input.contiguous();
  const at::Tensor mean_rows = centered ? mean->contiguous() : at::Tensor(), rstd_rows = rstd.contiguous();
  const int64_t n = input.size(-1);
  check_params(weight, bias, input, {n}, op);
  const at::Tensor w = kernel_param(weight), b = kernel_param(bias);
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  if (x.is_cuda()) {
    const NormShape shape{to_dtype(x.scalar_type(), op), x.numel() / n, n,
                          centered ? NormKind::Layer : NormKind::Rms, op, has_float_param(input, weight, bias)};
    const NormApplyBuffers<> io{x.const_data_ptr(),         data_or_null(mean_rows), rstd_rows.const_data_ptr(),
                                data_or_null(w),            data_or_null(b),         y.data_ptr()};
    const c10::DeviceGuard guard(x.device());
    normalize_rows_stub(x.device().type(), shape, io);
    return y;
  }
  // The CPU path serves the gloo tests: torch's element-wise ops in the
  // accumulator type.
  at::Tensor value = x.to(acc_type(input));
  if (centered) value = value - mean_rows.unsqueeze(-1);
  value = value * rstd_rows.unsqueeze(-1);
  if (w.defined()) value = value * w.to(value.scalar_type());
  if (b.defined()) value = value + b.to(value.scalar_type());
  y.copy_(value);
  return y;
}

}  // namespace fastreduce
