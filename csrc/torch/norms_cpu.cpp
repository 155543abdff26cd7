// CPU layer_norm and softmax, row by row with the same formulas as the CUDA
// kernels, accumulating in float (double for double inputs).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "common.h"

namespace fastreduce {
namespace {

// Rows per parallel task: about 32K elements.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }

// Sum of f(0..n) in blocks of 128: error grows with n / 128 + 128, not n.
template <typename A, typename F>
A blocked_sum(int64_t n, F&& f) {
  A total = 0;
  for (int64_t start = 0; start < n; start += 128) {
    A part = 0;
    for (int64_t i = start; i < std::min(n, start + 128); ++i) part += f(i);
    total += part;
  }
  return total;
}

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

template <typename F>
void for_each_row(const NormArgs& args, F&& f) {
  at::parallel_for(0, args.rows, grain(args.n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r, args.causal ? r % args.causal + 1 : args.n);
  });
}

}  // namespace

void layer_norm_forward_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y,
                            at::Tensor& mean, at::Tensor& rstd, const NormArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* xs = x.const_data_ptr<scalar_t>();
    const scalar_t* w = weight.defined() ? weight.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* b = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* ys = y.data_ptr<scalar_t>();
    auto* means = mean.data_ptr<scalar_t>();
    auto* rstds = rstd.data_ptr<scalar_t>();
    const int64_t n = args.n;
    for_each_row(args, [&](int64_t r, int64_t) {
      const scalar_t* row = xs + r * n;
      const A mu = blocked_sum<A>(n, [&](int64_t i) { return static_cast<A>(row[i]); }) / n;
      const A squares = blocked_sum<A>(n, [&](int64_t i) {
        const A d = static_cast<A>(row[i]) - mu;
        return d * d;
      });
      const A inv = A(1) / std::sqrt(squares / n + static_cast<A>(args.scalar));
      for (int64_t i = 0; i < n; ++i) {
        A v = (static_cast<A>(row[i]) - mu) * inv;
        if (w) v *= static_cast<A>(w[i]);
        if (b) v += static_cast<A>(b[i]);
        ys[r * n + i] = static_cast<scalar_t>(v);
      }
      means[r] = static_cast<scalar_t>(mu);
      rstds[r] = static_cast<scalar_t>(inv);
    });
  });
}

void layer_norm_backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
                             const at::Tensor& rstd, const at::Tensor& weight, at::Tensor& dx, at::Tensor* dweight,
                             at::Tensor* dbias, const NormArgs& args) {
  const at::Tensor mean_acc = mean.to(acc_type(x)).contiguous(), rstd_acc = rstd.to(acc_type(x)).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_backward", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* xs = x.const_data_ptr<scalar_t>();
    const scalar_t* gs = dy.const_data_ptr<scalar_t>();
    const scalar_t* w = weight.defined() ? weight.const_data_ptr<scalar_t>() : nullptr;
    const A* mu = mean_acc.const_data_ptr<A>();
    const A* inv = rstd_acc.const_data_ptr<A>();
    scalar_t* dxs = dx.data_ptr<scalar_t>();
    const int64_t n = args.n;
    for_each_row(args, [&](int64_t r, int64_t) {
      auto g = [&](int64_t i) { return static_cast<A>(gs[r * n + i]) * (w ? static_cast<A>(w[i]) : A(1)); };
      auto xhat = [&](int64_t i) { return (static_cast<A>(xs[r * n + i]) - mu[r]) * inv[r]; };
      const A sum_g = blocked_sum<A>(n, g);
      const A sum_gx = blocked_sum<A>(n, [&](int64_t i) { return g(i) * xhat(i); });
      for (int64_t i = 0; i < n; ++i) {
        dxs[r * n + i] = static_cast<scalar_t>(inv[r] * (g(i) - sum_g / n - xhat(i) * sum_gx / n));
      }
    });
    if (!dweight) return;
    // Columns in parallel, rows in order within each: deterministic.
    A* dw = dweight->data_ptr<A>();
    A* db = dbias->data_ptr<A>();
    at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        dw[c] = blocked_sum<A>(args.rows, [&](int64_t r) {
          return static_cast<A>(gs[r * n + c]) * (static_cast<A>(xs[r * n + c]) - mu[r]) * inv[r];
        });
        db[c] = blocked_sum<A>(args.rows, [&](int64_t r) { return static_cast<A>(gs[r * n + c]); });
      }
    });
  });
}

void softmax_forward_cpu(const at::Tensor& x, at::Tensor& y, const NormArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "softmax", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* xs = x.const_data_ptr<scalar_t>();
    scalar_t* ys = y.data_ptr<scalar_t>();
    const A scale = static_cast<A>(args.scalar);
    const int64_t n = args.n;
    for_each_row(args, [&](int64_t r, int64_t valid) {
      const scalar_t* row = xs + r * n;
      A top = MaxOp<A>::identity();
      for (int64_t i = 0; i < valid; ++i) top = MaxOp<A>::combine(top, scale * static_cast<A>(row[i]));
      const A sum = blocked_sum<A>(valid, [&](int64_t i) { return std::exp(scale * static_cast<A>(row[i]) - top); });
      for (int64_t i = 0; i < n; ++i)
        ys[r * n + i] = static_cast<scalar_t>(i < valid ? std::exp(scale * static_cast<A>(row[i]) - top) / sum : A(0));
    });
  });
}

void softmax_backward_cpu(const at::Tensor& dy, const at::Tensor& y, at::Tensor& dx, const NormArgs& args) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "softmax_backward", [&] {
    using A = at::opmath_type<scalar_t>;
    const scalar_t* ys = y.const_data_ptr<scalar_t>();
    const scalar_t* gs = dy.const_data_ptr<scalar_t>();
    scalar_t* dxs = dx.data_ptr<scalar_t>();
    const A scale = static_cast<A>(args.scalar);
    const int64_t n = args.n;
    for_each_row(args, [&](int64_t r, int64_t valid) {
      const A dot = blocked_sum<A>(
          valid, [&](int64_t i) { return static_cast<A>(ys[r * n + i]) * static_cast<A>(gs[r * n + i]); });
      for (int64_t i = 0; i < n; ++i)
        dxs[r * n + i] = static_cast<scalar_t>(
            i < valid ? scale * static_cast<A>(ys[r * n + i]) * (static_cast<A>(gs[r * n + i]) - dot) : A(0));
    });
  });
}

}  // namespace fastreduce
