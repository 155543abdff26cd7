// torch semantics of var/std (and with the mean), logsumexp and the vector
// norm: dtypes, corrections, orders, empty inputs.
#include <cmath>

#include "kernels.h"
#include "ops.h"
#include "reduction.h"

namespace fastreduce {
namespace {

// var/std/var_mean/std_mean: one Welford pass; the second output, when
// wanted, is the mean.
std::pair<at::Tensor, at::Tensor> moments(const char* op, const at::Tensor& self, at::OptionalIntArrayRef dim,
                                          const std::optional<at::Scalar>& correction, bool keepdim, bool root,
                                          bool with_mean) {
  to_dtype(self.scalar_type(), op);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), op,
              ": std and var only support floating point and complex dtypes, got ", to_text(self.scalar_type()));
  const auto reduced = reduced_dims(self.dim(), dim);
  ReduceParams params;
  params.correction = correction.has_value() ? correction->toDouble() : 1.0;
  // torch's warning at every such call (the Python wrappers' bindings make it
  // a Python warning), then whatever NaN or inf the formula gives.
  // (torch counts 0 elements per output whenever the input is empty).
  const int64_t count = self.numel() == 0 ? 0 : reduced_count(self, reduced).expect_int();
  if (static_cast<double>(count) - params.correction <= 0)
    TORCH_WARN(op, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor ",
               "(input numel divided by output numel).");
  if (self.numel() == 0) {
    const auto nan = at::full(output_shape(self, reduced, keepdim), std::nan(""), self.options());
    return {nan, with_mean ? nan.clone() : at::Tensor()};
  }
  params.root = root;
  return run_reduction(ReduceKind::Var, params, self, reduced, keepdim, self.scalar_type(), with_mean);
}

}  // namespace

at::Tensor backend::var(const at::Tensor& self, at::OptionalIntArrayRef dim,
                        const std::optional<at::Scalar>& correction, bool keepdim) {
  return moments("var", self, dim, correction, keepdim, false, false).first;
}

at::Tensor backend::stddev(const at::Tensor& self, at::OptionalIntArrayRef dim,
                           const std::optional<at::Scalar>& correction, bool keepdim) {
  return moments("std", self, dim, correction, keepdim, true, false).first;
}

std::tuple<at::Tensor, at::Tensor> backend::var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                                     const std::optional<at::Scalar>& correction, bool keepdim) {
  auto [var, mean] = moments("var_mean", self, dim, correction, keepdim, false, true);
  return {var, mean};
}

std::tuple<at::Tensor, at::Tensor> backend::stddev_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                                        const std::optional<at::Scalar>& correction, bool keepdim) {
  auto [std, mean] = moments("std_mean", self, dim, correction, keepdim, true, true);
  return {std, mean};
}

// Integer inputs compute in the default float dtype, as torch.logsumexp does.
at::Tensor backend::logsumexp(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  to_dtype(self.scalar_type(), "logsumexp");
  const at::Tensor x = at::isFloatingType(self.scalar_type()) ? self : self.to(at::get_default_dtype_as_scalartype());
  const auto reduced = reduced_dims(x.dim(), dim);
  if (x.numel() == 0)
    return at::full(output_shape(x, reduced, keepdim), -std::numeric_limits<double>::infinity(), x.options());
  return run_reduction(ReduceKind::LogSumExp, {}, x, reduced, keepdim, x.scalar_type()).first;
}

// torch.linalg.vector_norm: floating input (or a floating dtype, to which
// the input is cast first).
at::Tensor backend::norm(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
  const char* op = "norm";
  to_dtype(self.scalar_type(), op);
  const auto compute = dtype.value_or(self.scalar_type());
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), op,
              ": Expected a floating point tensor as argument 'self', got ", to_text(self.scalar_type()));
  TORCH_CHECK(at::isFloatingType(compute), op, ": argument 'dtype' must be a floating dtype, got ",
              to_text(compute));
  TORCH_CHECK(at::promote_types(self.scalar_type(), compute) == compute, op, ": the dtype of the input (",
              to_text(self.scalar_type()), ") should be convertible without narrowing to the specified dtype (",
              to_text(compute), ")");
  TORCH_CHECK(!ord.isComplex(), op, ": argument 'ord' must be real");
  const at::Tensor x = self.to(compute);
  const double p = ord.toDouble();
  const auto reduced = reduced_dims(x.dim(), dim);
  if (reduced_count(x, reduced).expect_int() == 0) {
    TORCH_CHECK(p >= 0 && !std::isinf(p), op, ": cannot compute the ", std::to_string(p),
                " norm on an empty tensor because the operation does not have an identity");
    return at::zeros(output_shape(x, reduced, keepdim), x.options());
  }
  if (x.numel() == 0) return at::empty(output_shape(x, reduced, keepdim), x.options());
  // One element per output: |x| (x != 0 for ord 0), as torch, with no power
  // and root to overflow on the way.
  if (reduced_count(x, reduced).expect_int() == 1)
    return (p == 0 ? (x != 0).to(compute) : x.abs()).reshape(output_shape(x, reduced, keepdim));
  ReduceParams params;
  params.ord = p;
  return run_reduction(ReduceKind::Norm, params, x, reduced, keepdim, compute).first;
}

}  // namespace fastreduce

namespace fastreduce {

// Float, float16 and bfloat16 CUDA tensors go through one multi-tensor pass;
// the rest take one norm each. Every norm is a tensor of its own: a custom
// operator's outputs may not alias one another (an error from torch 2.12).
std::vector<at::Tensor> backend::foreach_norm(at::TensorList tensors, const at::Scalar& ord) {
  const char* op = "foreach_norm";
  TORCH_CHECK(!ord.isComplex(), op, ": argument 'ord' must be real");
  const double p = ord.toDouble();
  std::vector<at::Tensor> norms(tensors.size());
  std::vector<at::Tensor> batched;
  std::vector<size_t> where;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": argument 'tensors' must hold floating tensors, got ",
                to_text(t.scalar_type()), " at index ", to_text(static_cast<int64_t>(i)));
    TORCH_CHECK(t.numel() != 0 || (p >= 0 && !std::isinf(p)), op, ": cannot compute the ", std::to_string(p),
                " norm of the empty tensor at index ", to_text(static_cast<int64_t>(i)));
    if (t.numel() == 0) {
      norms[i] = at::zeros({}, t.options());
    } else if (t.is_cuda() && t.scalar_type() != at::kDouble) {
      TORCH_CHECK(batched.empty() || t.device() == batched[0].device(), op,
                  ": argument 'tensors' must be on one device, got ", to_text(batched[0].device()), " and ",
                  to_text(t.device()));
      batched.push_back(t.contiguous());
      where.push_back(i);
    } else {
      norms[i] = norm(t, ord, std::nullopt, false, std::nullopt);
    }
  }
  if (batched.empty()) return norms;
  std::vector<at::Tensor> batched_norms = foreach_norm_stub(batched[0].device().type(), batched, p);
  for (size_t k = 0; k < where.size(); ++k) norms[where[k]] = std::move(batched_norms[k]);
  return norms;
}

}  // namespace fastreduce
