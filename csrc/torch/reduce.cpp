// torch semantics of sum/mean/prod/amax/amin: dims, keepdim, dtype
// promotion, empty tensors; and the layout work that turns any strided input
// into the dense (outer, len, inner) view the kernels take.
#include <bitset>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "ops.h"
#include "reduction.h"

namespace fastreduce {
namespace {

// The kept dims, then the reduced ones, each in logical order.
std::vector<int64_t> kept_then_reduced(int64_t ndim, const std::bitset<kMaxDims>& reduced) {
  std::vector<int64_t> order;
  for (int64_t d = 0; d < ndim; ++d)
    if (!reduced[d]) order.push_back(d);
  for (int64_t d = 0; d < ndim; ++d)
    if (reduced[d]) order.push_back(d);
  return order;
}

// A dense view of the input, reduced over `len`, whose output buffer holds
// the kept dims in `kept_order` (logical dim indices, memory order).
struct Layout {
  at::Tensor dense;
  int64_t outer = 1, len = 1, inner = 1;
  std::vector<int64_t> kept_order;
};

// Finds (outer, len, inner) without a copy when the input is a dense
// permutation whose kept and reduced dims form at most kept|reduced|kept in
// memory order (contiguous, transposed, most slices of those). Otherwise
// copies once into (kept..., reduced...) order.
Layout make_layout(const at::Tensor& x, const std::bitset<kMaxDims>& reduced) {
  const int64_t ndim = x.dim();
  std::vector<int64_t> order(ndim);
  std::iota(order.begin(), order.end(), 0);
  at::Tensor source = x;
  if (x.is_non_overlapping_and_dense()) {
    // Memory order: outermost (largest stride) first; size-1 dims do not matter.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  } else {
    source = x.contiguous();
  }

  // Runs of kept/reduced dims in memory order, size-1 dims skipped.
  std::vector<std::pair<bool, int64_t>> runs;
  Layout layout;
  for (int64_t d : order) {
    if (x.size(d) == 1) continue;
    if (!reduced[d]) layout.kept_order.push_back(d);
    if (!runs.empty() && runs.back().first == reduced[d]) runs.back().second *= x.size(d);
    else runs.emplace_back(reduced[d], x.size(d));
  }
  const bool direct = runs.size() <= 2 || (runs.size() == 3 && !runs[0].first);
  if (direct) {
    // Dense and contiguous by construction (a contiguous input as it is).
    layout.dense = std::is_sorted(order.begin(), order.end()) ? source : source.permute(order);
    size_t i = 0;
    if (i < runs.size() && !runs[i].first) layout.outer = runs[i++].second;
    if (i < runs.size() && runs[i].first) layout.len = runs[i++].second;
    if (i < runs.size()) layout.inner = runs[i].second;
    return layout;
  }
  const std::vector<int64_t> kept_first = kept_then_reduced(ndim, reduced);
  layout.kept_order.clear();
  for (int64_t d : kept_first) {
    if (reduced[d]) {
      layout.len *= x.size(d);
    } else {
      layout.outer *= x.size(d);
      if (x.size(d) != 1) layout.kept_order.push_back(d);
    }
  }
  layout.dense = x.permute(kept_first).contiguous();
  return layout;
}

}  // namespace

std::vector<int64_t> output_shape(const at::Tensor& x, const std::bitset<kMaxDims>& reduced, bool keepdim) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduced[d]) shape.push_back(x.size(d));
    else if (keepdim) shape.push_back(1);
  }
  return shape;
}

c10::SymInt reduced_count(const at::Tensor& x, const std::bitset<kMaxDims>& reduced) {
  c10::SymInt count = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduced[d]) count = count * x.sym_size(d);
  return count;
}

std::bitset<kMaxDims> reduced_dims(int64_t ndim, at::OptionalIntArrayRef dim) {
  std::bitset<kMaxDims> reduced;
  if (dim.has_value() && !dim->empty()) {
    for (int64_t d : *dim) {
      const int64_t wrapped = wrap_dim(d, ndim);
      TORCH_CHECK(!reduced[wrapped], "dim ", to_text(wrapped), " appears multiple times in the list of dims");
      reduced.set(wrapped);
    }
  } else {
    for (int64_t d = 0; d < std::max<int64_t>(ndim, 1); ++d) reduced.set(d);
  }
  return reduced;
}

void check_nonempty_reduction(const char* op, const at::Tensor& x, const std::bitset<kMaxDims>& reduced,
                              bool dim_given) {
  TORCH_CHECK(x.numel() != 0 || dim_given, op,
              "(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
              "reduction dim with the 'dim' argument.");
  for (int64_t d = 0; d < x.dim(); ++d)
    TORCH_CHECK_INDEX(!reduced[d] || x.size(d) != 0, op, "(): Expected reduction dim ", to_text(d),
                      " to have non-zero size.");
}

std::pair<at::Tensor, at::Tensor> run_reduction(ReduceKind kind, const ReduceParams& params, const at::Tensor& x,
                                                const std::bitset<kMaxDims>& reduced, bool keepdim,
                                                at::ScalarType out_dtype, bool two_outputs) {
  const auto shape = output_shape(x, reduced, keepdim);
  Layout layout = make_layout(x, reduced);
  // The buffer holds the kept dims in memory order: when that is their
  // logical order (a contiguous input), it is the output itself.
  const bool in_order = std::is_sorted(layout.kept_order.begin(), layout.kept_order.end());
  std::vector<int64_t> buffer_shape;
  for (int64_t d : layout.kept_order) buffer_shape.push_back(x.size(d));
  const auto options = x.options().dtype(out_dtype);
  at::Tensor out = at::empty(in_order ? shape : buffer_shape, options);
  at::Tensor second = two_outputs ? at::empty_like(out) : at::Tensor();
  const ReduceProblem problem{kind,         to_dtype(x.scalar_type(), "reduce"), layout.dense.const_data_ptr(),
                              layout.outer, layout.len,                          layout.inner,
                              params,       second.defined() ? second.data_ptr() : nullptr};
  const c10::DeviceGuard guard(x.device());
  reduce_stub(x.device().type(), problem, out.data_ptr());
  if (in_order) return {out, second};

  std::vector<int64_t> to_logical(layout.kept_order.size());
  std::iota(to_logical.begin(), to_logical.end(), 0);
  std::sort(to_logical.begin(), to_logical.end(),
            [&](int64_t a, int64_t b) { return layout.kept_order[a] < layout.kept_order[b]; });
  auto logical = [&](const at::Tensor& t) {
    return t.defined() ? t.permute(to_logical).contiguous().view(shape) : t;
  };
  return {logical(out), logical(second)};
}

namespace {

// Identity-valued output for a reduction over zero elements.
at::Scalar empty_value(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Prod: return 1;
    case ReduceKind::Mean: return std::numeric_limits<double>::quiet_NaN();
    default: return 0;
  }
}

bool is_wide_integer_result(ReduceKind kind) { return kind == ReduceKind::Sum || kind == ReduceKind::Prod; }

// x is already cast to the compute dtype; out_dtype is what the user gets.
at::Tensor reduce(ReduceKind kind, const char* op, const at::Tensor& x, at::OptionalIntArrayRef dim,
                  bool keepdim, at::ScalarType out_dtype) {
  to_dtype(x.scalar_type(), op);
  const std::bitset<kMaxDims> reduced = reduced_dims(x.dim(), dim);
  if (kind == ReduceKind::Max || kind == ReduceKind::Min)
    check_nonempty_reduction(op, x, reduced, dim.has_value() && !dim->empty());

  const bool widen = is_wide_integer_result(kind) && at::isIntegralType(x.scalar_type(), true);
  const auto kernel_dtype = widen ? at::kLong : x.scalar_type();
  if (x.numel() == 0)
    return at::full(output_shape(x, reduced, keepdim), empty_value(kind), x.options().dtype(kernel_dtype))
        .to(out_dtype);
  const at::Tensor out = run_reduction(kind, {}, x, reduced, keepdim, kernel_dtype).first;
  return kernel_dtype == out_dtype ? out : out.to(out_dtype);
}

// sum and prod: integers and bools give int64 unless `dtype` says otherwise;
// with `dtype`, the input is cast first, as torch does.
at::Tensor reduce_with_dtype(ReduceKind kind, const char* op, const at::Tensor& self,
                             at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  to_dtype(self.scalar_type(), op);
  if (dtype.has_value()) {
    to_dtype(*dtype, op);
    return reduce(kind, op, self.to(*dtype), dim, keepdim, *dtype);
  }
  const bool widen = at::isIntegralType(self.scalar_type(), true);
  return reduce(kind, op, self, dim, keepdim, widen ? at::kLong : self.scalar_type());
}

}  // namespace

at::Tensor backend::sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                        std::optional<at::ScalarType> dtype) {
  return reduce_with_dtype(ReduceKind::Sum, "sum", self, dim, keepdim, dtype);
}

at::Tensor backend::prod(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
  return reduce_with_dtype(ReduceKind::Prod, "prod", self, dim, keepdim, dtype);
}

at::Tensor backend::mean(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
  to_dtype(self.scalar_type(), "mean");
  const auto compute = dtype.value_or(self.scalar_type());
  TORCH_CHECK(at::isFloatingType(compute),
              "mean(): could not infer output dtype. ", dtype.has_value() ? "Optional" : "Input",
              " dtype must be either a floating point or complex dtype. Got: ", c10::toString(compute));
  return reduce(ReduceKind::Mean, "mean", self.to(compute), dim, keepdim, compute);
}

namespace {

// The product of the other elements of each x_i's reduction, from exclusive
// products from both ends of the reduction as one row (torch's formula where a
// zero rules out result / x_i). No division: exact where the whole product
// underflows to 0 and the others' does not.
at::Tensor product_of_others(const at::Tensor& x, const std::bitset<kMaxDims>& reduced) {
  const std::vector<int64_t> order = kept_then_reduced(x.dim(), reduced);
  std::vector<int64_t> inverse(x.dim()), rows_shape;
  for (size_t i = 0; i < order.size(); ++i) {
    inverse[order[i]] = static_cast<int64_t>(i);
    if (!reduced[order[i]]) rows_shape.push_back(x.size(order[i]));
  }
  const at::Tensor permuted = x.permute(order);
  rows_shape.push_back(-1);
  const at::Tensor rows = permuted.reshape(rows_shape);
  const int64_t n = rows.size(-1);
  const at::Tensor one = at::ones_like(rows.narrow(-1, 0, 1));
  const at::Tensor before = at::cat({one, rows.narrow(-1, 0, n - 1)}, -1).cumprod(-1);
  const at::Tensor after = at::cat({rows.narrow(-1, 1, n - 1), one}, -1).flip(-1).cumprod(-1).flip(-1);
  return (before * after).reshape(permuted.sizes()).permute(inverse);
}

}  // namespace

// d prod / d x_i is the product of the other elements of x_i's reduction.
// Where the reduction holds no zero and its result is not 0 that is
// result / x_i, as torch computes it (recomputing it could round differently:
// a partial product that underflows to 0 before meeting an inf gives NaN).
// Where it holds a zero, or its product underflowed to 0, it is the product
// of the others (torch's formula when any element of the tensor is zero).
// Chosen per reduction on the device: no host sync.
at::Tensor backend::prod_backward(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& result,
                                  at::OptionalIntArrayRef dim, bool keepdim) {
  const char* op = "prod_backward";
  TORCH_CHECK(at::isFloatingType(grad.scalar_type()), op, ": argument 'grad' must be floating, got ",
              to_text(grad.scalar_type()));
  TORCH_CHECK(grad.sizes() == result.sizes(), op, ": argument 'grad' has shape ", to_text(grad.sizes()),
              " but 'result' has shape ", to_text(result.sizes()));
  check_same_device(self, grad, op, "self", "grad");
  check_same_device(result, grad, op, "result", "grad");
  const std::bitset<kMaxDims> reduced = reduced_dims(self.dim(), dim);
  // The product of a 0-d tensor is itself: its gradient is grad, as torch's
  // (NaN or not), copied (an operator's output may not alias its input).
  if (self.dim() == 0) return grad.to(self.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  if (self.numel() == 0) return at::zeros_like(self);
  const at::Tensor x = self.to(grad.scalar_type());
  auto broadcast = [&](at::Tensor t) {
    if (!keepdim) {
      for (int64_t d = 0; d < self.dim(); ++d)
        if (reduced[d]) t = t.unsqueeze(d);
    }
    return t;
  };
  const at::Tensor zeros = broadcast(reduce(ReduceKind::Sum, op, x == 0, dim, keepdim, at::kLong));
  const at::Tensor product = broadcast(result.to(x.scalar_type()));
  const at::Tensor others =
      at::where((zeros > 0).logical_or(product == 0), product_of_others(x, reduced), product / x);
  // torch's product of all elements gives 0 where two or more are zero,
  // whatever the incoming gradient (inf and NaN too); its product over a dim
  // multiplies, as above.
  const at::Tensor product_gradient = broadcast(grad) * others;
  const at::Tensor gradient = dim.has_value() ? product_gradient : at::where(zeros > 1, 0, product_gradient);
  return gradient.to(self.scalar_type()).contiguous();  // whatever self's strides, as the fake
}

at::Tensor backend::amax(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return reduce(ReduceKind::Max, "amax", self, dim, keepdim, self.scalar_type());
}

at::Tensor backend::amin(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  return reduce(ReduceKind::Min, "amin", self, dim, keepdim, self.scalar_type());
}

}  // namespace fastreduce
