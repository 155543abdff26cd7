// torch semantics of argmax/argmin, aminmax and any/all.
#include "ops.h"
#include "reduction.h"

namespace fastreduce {
namespace {

// A single dim (wrapped) or, with none, every dim of the input.
std::bitset<kMaxDims> one_or_all_dims(const at::Tensor& x, std::optional<int64_t> dim) {
  if (!dim.has_value()) return reduced_dims(x.dim(), std::nullopt);
  const int64_t wrapped = wrap_dim(*dim, x.dim());
  return reduced_dims(x.dim(), at::IntArrayRef(&wrapped, 1));
}

// argmax/argmin: with no dim, the index into the flattened input (logical
// row-major order, so a transposed input is made contiguous first); with
// keepdim and no dim, every dim kept as 1, as torch.
at::Tensor arg_extremum(ReduceKind kind, const char* op, const at::Tensor& self, std::optional<int64_t> dim,
                        bool keepdim) {
  to_dtype(self.scalar_type(), op);
  TORCH_CHECK(self.scalar_type() != at::kBool, op, "(): does not support bool input");
  const auto reduced = one_or_all_dims(self, dim);
  check_nonempty_reduction(op, self, reduced, dim.has_value());
  const bool all_dims = !dim.has_value();
  const at::Tensor x = all_dims ? self.contiguous() : self;
  if (x.numel() == 0) return at::empty(output_shape(x, reduced, keepdim), x.options().dtype(at::kLong));
  return run_reduction(kind, {}, x, reduced, keepdim, at::kLong).first;
}

// any/all give bool, or uint8 for a uint8 input (torch's legacy rule).
at::Tensor logical(ReduceKind kind, const char* op, const at::Tensor& self, at::OptionalIntArrayRef dim,
                   bool keepdim) {
  to_dtype(self.scalar_type(), op);
  const auto out_dtype = self.scalar_type() == at::kByte ? at::kByte : at::kBool;
  // An empty dim list reduces nothing (torch's any/all; sum reads it as every dim).
  if (dim.has_value() && dim->empty() && self.dim() > 0) return self.ne(0).to(out_dtype);
  const auto reduced = reduced_dims(self.dim(), dim);
  if (self.numel() == 0)
    return at::full(output_shape(self, reduced, keepdim), kind == ReduceKind::All ? 1 : 0,
                    self.options().dtype(out_dtype));
  return run_reduction(kind, {}, self, reduced, keepdim, out_dtype).first;
}

}  // namespace

at::Tensor backend::argmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(ReduceKind::ArgMax, "argmax", self, dim, keepdim);
}

at::Tensor backend::argmin(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(ReduceKind::ArgMin, "argmin", self, dim, keepdim);
}

std::tuple<at::Tensor, at::Tensor> backend::aminmax(const at::Tensor& self, std::optional<int64_t> dim,
                                                    bool keepdim) {
  const char* op = "aminmax";
  to_dtype(self.scalar_type(), op);
  const auto reduced = one_or_all_dims(self, dim);
  TORCH_CHECK(self.numel() != 0 || dim.has_value(), op,
              "(): cannot compute aminmax over an empty dimension as the operation has no identity.");
  for (int64_t d = 0; d < self.dim(); ++d)
    TORCH_CHECK_INDEX(!reduced[d] || self.size(d) != 0, op,
                      "(): cannot compute aminmax over an empty dimension as the operation has no identity.");
  if (self.numel() == 0) {
    const auto empty = at::empty(output_shape(self, reduced, keepdim), self.options());
    return {empty, empty.clone()};
  }
  auto [min, max] = run_reduction(ReduceKind::MinMax, {}, self, reduced, keepdim, self.scalar_type(), true);
  return {min, max};
}

at::Tensor backend::any(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  return logical(ReduceKind::Any, "any", self, dim, keepdim);
}

at::Tensor backend::all(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  return logical(ReduceKind::All, "all", self, dim, keepdim);
}

}  // namespace fastreduce
