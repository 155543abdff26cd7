// CPU layer_norm, rms_norm (each optionally after a residual add) and
// softmax, row by row with the same formulas as the CUDA
// kernels, on at::vec vectors in float (double for double inputs);
// float16/bfloat16 rows are widened into a per-thread buffer first.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../torch/kernels.h"
#include "vec.h"

namespace fastreduce {
namespace {

using cpu::Vec;

template <typename A>
Vec<A> vec_exp(const Vec<A>& v) {
  if constexpr (std::is_same_v<A, float>) return v.exp_u20();
  else return v.exp();
}

// The row's accumulator values: the data itself for float and double, a
// widened copy for half types.
template <typename T, typename A = at::opmath_type<T>>
struct RowBuffers {
  std::vector<A> in, grad, out;
};

// The row buffer results are computed into: the output row itself when T is
// the accumulator type.
template <typename T, typename A>
A* output_row(T* out, std::vector<A>& buffer, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    return out;
  } else {
    buffer.resize(n);
    return buffer.data();
  }
}

// h = x + residual rounded to T, as the unfused add would store it, written
// to `h` and returned as accumulator values: the float row itself, or for
// half types the rounded sums widened into `wide` in the same pass.
template <typename T, typename A = at::opmath_type<T>>
const A* add_rounded(const T* x, const T* residual, T* h, int64_t n, std::vector<A>& wide) {
  using V = Vec<A>;
  if constexpr (std::is_same_v<T, A>) {
    cpu::for_each_vector<A>(n, [&](int64_t i, int64_t count) {
      (V::loadu(x + i, count) + V::loadu(residual + i, count)).store(h + i, count);
    });
    return h;
  } else {
    wide.resize(n);
    constexpr int64_t step = 2 * V::size();  // one vector of T
    int64_t i = 0;
    for (; i + step <= n; i += step) {
      auto [x0, x1] = at::vec::convert_to_float<T>(Vec<T>::loadu(x + i));
      auto [r0, r1] = at::vec::convert_to_float<T>(Vec<T>::loadu(residual + i));
      const Vec<T> sum = at::vec::convert_from_float<T>(x0 + r0, x1 + r1);
      sum.store(h + i);
      auto [h0, h1] = at::vec::convert_to_float<T>(sum);
      h0.store(wide.data() + i);
      h1.store(wide.data() + i + V::size());
    }
    for (; i < n; ++i) {
      h[i] = static_cast<T>(static_cast<A>(x[i]) + static_cast<A>(residual[i]));
      wide[i] = static_cast<A>(h[i]);
    }
    return wide.data();
  }
}

// P: the parameters' type (T, or float beside half rows).
template <typename T, typename P>
void norm_forward_rows(const NormShape& shape, const NormForwardBuffers<T, at::opmath_type<T>, P>& io, double epsilon) {
  using A = at::opmath_type<T>;
  using V = Vec<A>;
  const int64_t n = shape.n;
  const bool centered = shape.centered();
  std::vector<A> w_buffer, b_buffer;
  const A* w = io.weight ? cpu::widen(io.weight, n, w_buffer) : nullptr;
  const A* b = io.bias ? cpu::widen(io.bias, n, b_buffer) : nullptr;
  const T* xs = io.x;
  const T* adds = io.residual;
  T* hs = io.residual_out;
  T* ys = io.y;
  A* means = io.mean;
  A* rstds = io.rstd;
  const A eps = static_cast<A>(epsilon);
  at::parallel_for(0, shape.rows, cpu::row_grain(n), [&](int64_t begin, int64_t end) {
    RowBuffers<T> buffers;
    for (int64_t r = begin; r < end; ++r) {
      const T* source = xs + r * n;
      const A* row = adds ? add_rounded(source, adds + r * n, hs + r * n, n, buffers.in)
                          : cpu::widen(source, n, buffers.in);
      // The mean as x[0] + mean(x - x[0]) (x[0] when finite): the sum then
      // rounds at the scale of the row's spread, not its magnitude (a float
      // sum of rows around 1000 gave 2-5x torch's error).
      const A shift = centered && std::isfinite(row[0]) ? row[0] : A(0);
      A mu = centered ? shift + cpu::sum(row, n, [shift](auto v) { return v - decltype(v)(shift); }) / n : A(0);
      const A squares = cpu::sum(row, n, [mu](auto v) {
        const auto d = v - decltype(v)(mu);
        return d * d;
      });
      A variance = squares / n;
      // A first value far from the mean leaves the rounding of its deviations
      // in mu: a pass over the deviations from mu corrects it (Chan, Golub
      // and LeVeque), as the GPU kernels do.
      if (centered && (mu - shift) * (mu - shift) > A(LayerNormMath::kShiftedSpreadMax) * variance) {
        const A correction = cpu::sum(row, n, [mu](auto v) { return v - decltype(v)(mu); }) / n;
        if (std::isfinite(correction)) {
          mu += correction;
          variance = std::max(variance - correction * correction, A(0));
        }
      }
      const A inv = A(1) / std::sqrt(variance + eps);
      cpu::store_narrowed(row, n, ys + r * n, [&](int64_t i, int64_t count, V v) {
        v = (v - V(mu)) * V(inv);
        if (w) v = v * V::loadu(w + i, count);
        if (b) v = v + V::loadu(b + i, count);
        return v;
      });
      if (means) means[r] = mu;
      rstds[r] = inv;
    }
  });
}

// Rows per dweight/dbias partial: fixed by the shape (at most 256 partials),
// never by the thread count, so the sums are reproducible.
int64_t rows_per_partial(int64_t rows) { return std::max<int64_t>(32, (rows + 255) / 256); }

template <typename T, typename P>
void norm_backward_rows(const NormShape& shape, const NormBackwardBuffers<T, at::opmath_type<T>, P>& io,
                        const NormParamGrads& grads) {
  using A = at::opmath_type<T>;
  using V = Vec<A>;
  const int64_t n = shape.n, rows = shape.rows;
  const bool centered = shape.centered();
  const A* mu = io.mean;
  const A* inv = io.rstd;
  std::vector<A> w_buffer;
  const A* w = io.weight ? cpu::widen(io.weight, n, w_buffer) : nullptr;
  const T* xs = io.x;
  const T* gs = io.dy;
  const T* carried = io.grad_residual;
  T* dxs = io.dx;
  const bool dweight = grads.dweight != nullptr, dbias = grads.dbias != nullptr;

  const int64_t per_partial = rows_per_partial(rows);
  const int64_t partials = (rows + per_partial - 1) / per_partial;
  std::vector<A> dw_partial(dweight ? partials * n : 0), db_partial(dbias ? partials * n : 0);
  at::parallel_for(0, partials, 1, [&](int64_t begin, int64_t end) {
    RowBuffers<T> buffers;
    std::vector<A> g_buffer(n), carried_buffer;
    for (int64_t p = begin; p < end; ++p) {
      A* dw = dweight ? dw_partial.data() + p * n : nullptr;
      A* db = dbias ? db_partial.data() + p * n : nullptr;
      if (dw) std::fill(dw, dw + n, A(0));
      if (db) std::fill(db, db + n, A(0));
      for (int64_t r = p * per_partial; r < std::min(rows, (p + 1) * per_partial); ++r) {
        const A* xrow = cpu::widen(xs + r * n, n, buffers.in);
        const A* grow = cpu::widen(gs + r * n, n, buffers.grad);
        const V m(mu ? mu[r] : A(0)), s(inv[r]);
        // g = dy * w, and the two row sums the dx formula needs.
        A* g = g_buffer.data();
        V sum_g(0), sum_gx(0);
        cpu::for_each_vector<A>(n, [&](int64_t i, int64_t count) {
          const V dyv = V::loadu(grow + i, count);
          const V xhat = (V::loadu(xrow + i, count) - m) * s;
          const V gv = w ? dyv * V::loadu(w + i, count) : dyv;
          gv.store(g + i, count);
          // Tail lanes past `count` load as zero and add nothing.
          sum_g = sum_g + gv;
          sum_gx = sum_gx + gv * xhat;
          if (dw) (V::loadu(dw + i, count) + dyv * xhat).store(dw + i, count);
          if (db) (V::loadu(db + i, count) + dyv).store(db + i, count);
        });
        const V mean_g(centered ? at::vec::vec_reduce_all([](V a, V b) { return a + b; }, sum_g) / n : A(0));
        const V mean_gx(at::vec::vec_reduce_all([](V a, V b) { return a + b; }, sum_gx) / n);
        const A* carried_row = carried ? cpu::widen(carried + r * n, n, carried_buffer) : nullptr;
        A* out = output_row(dxs + r * n, buffers.out, n);
        cpu::for_each_vector<A>(n, [&](int64_t i, int64_t count) {
          const V xhat = (V::loadu(xrow + i, count) - m) * s;
          V v = s * (V::loadu(g + i, count) - mean_g - xhat * mean_gx);
          if (carried_row) v = v + V::loadu(carried_row + i, count);
          v.store(out + i, count);
        });
        cpu::narrow(out, dxs + r * n, n);
      }
    }
  });
  // The partials in order, columns in parallel: deterministic. Each sum is
  // written in its gradient's dtype (T, or A beside float32 parameters).
  auto fold = [&](const std::vector<A>& partial, void* total, bool in_input_type) {
    at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
      std::vector<A> sums(end - begin, A(0));
      for (int64_t p = 0; p < partials; ++p)
        for (int64_t c = begin; c < end; ++c) sums[c - begin] += partial[p * n + c];
      if (in_input_type) cpu::narrow(sums.data(), static_cast<T*>(total) + begin, end - begin);
      else cpu::narrow(sums.data(), static_cast<A*>(total) + begin, end - begin);
    });
  };
  if (dweight) fold(dw_partial, grads.dweight, grads.dweight_in_input_type);
  if (dbias) fold(db_partial, grads.dbias, grads.dbias_in_input_type);
}

template <typename T>
void softmax_forward_rows(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io) {
  using A = at::opmath_type<T>;
  using V = Vec<A>;
  const T* xs = static_cast<const T*>(io.x);
  T* ys = static_cast<T*>(io.y);
  const A scale = static_cast<A>(shape.scale);
  const int64_t n = shape.n;
  at::parallel_for(0, shape.rows, cpu::row_grain(n), [&](int64_t begin, int64_t end) {
    RowBuffers<T> buffers;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t valid = shape.causal ? r % shape.causal + 1 : n;
      A* out = output_row(ys + r * n, buffers.out, n);
      // scale * x goes into the output row, rounded there (a product fused
      // into the subtraction below would leave its rounding error, huge for
      // huge scores, in the largest entry's exponent); then the exponentials,
      // then their scaling by 1/sum. Half types widen on the way in and
      // narrow on the way out: three passes over the row.
      V top(-std::numeric_limits<A>::infinity());
      auto scale_into_out = [&](int64_t i, int64_t count, V v) {
        v = v * V(scale);
        v.store(out + i, count);
        top = at::vec::maximum(top, count == V::size() ? v : V::set(top, v, count));
      };
      cpu::for_each_widened(xs + r * n, valid, scale_into_out);
      const A largest = at::vec::vec_reduce_all([](V a, V b) { return at::vec::maximum(a, b); }, top);
      if (!std::isfinite(largest) && valid > 0) {  // a NaN or +inf (or every entry -inf): NaN, as torch
        std::fill(out, out + valid, std::numeric_limits<A>::quiet_NaN());
        std::fill(out + valid, out + n, A(0));
        cpu::narrow(out, ys + r * n, n);
        continue;
      }
      const V row_max(largest);
      V total(0);
      cpu::for_each_vector<A>(valid, [&](int64_t i, int64_t count) {
        const V e = vec_exp(V::loadu(out + i, count) - row_max);
        total = total + (count == V::size() ? e : V::set(V(0), e, count));
        e.store(out + i, count);
      });
      const V inv_sum(A(1) / at::vec::vec_reduce_all([](V a, V b) { return a + b; }, total));
      cpu::store_narrowed(out, valid, ys + r * n, [&](int64_t, int64_t, V v) { return v * inv_sum; });
      std::fill(ys + r * n + valid, ys + r * n + n, T(0));
    }
  });
}

// One float16/bfloat16 softmax backward row, widened in registers 16
// elements at a time (two passes over the row instead of five through a
// float buffer): dx = scale * y * (dy - sum(y * dy)).
template <typename T>
void half_softmax_backward_row(const T* y, const T* g, T* dx, int64_t valid, int64_t n, float s) {
  using V = Vec<float>;
  const V scale(s);
  using H = Vec<T>;
  V dot_low(0), dot_high(0);
  int64_t i = 0;
  for (; i + H::size() <= valid; i += H::size()) {
    auto [y0, y1] = at::vec::convert_to_float<T>(H::loadu(y + i));
    auto [g0, g1] = at::vec::convert_to_float<T>(H::loadu(g + i));
    dot_low = at::vec::fmadd(y0, g0, dot_low);
    dot_high = at::vec::fmadd(y1, g1, dot_high);
  }
  float dot = at::vec::vec_reduce_all([](V a, V b) { return a + b; }, dot_low + dot_high);
  for (int64_t j = i; j < valid; ++j) dot += static_cast<float>(y[j]) * static_cast<float>(g[j]);
  const V row_dot(dot);
  for (i = 0; i + H::size() <= valid; i += H::size()) {
    auto [y0, y1] = at::vec::convert_to_float<T>(H::loadu(y + i));
    auto [g0, g1] = at::vec::convert_to_float<T>(H::loadu(g + i));
    at::vec::convert_from_float<T>(scale * y0 * (g0 - row_dot), scale * y1 * (g1 - row_dot)).store(dx + i);
  }
  for (; i < valid; ++i) dx[i] = static_cast<T>(s * static_cast<float>(y[i]) * (static_cast<float>(g[i]) - dot));
  std::fill(dx + valid, dx + n, T(0));
}

template <typename T>
void softmax_backward_rows(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io) {
  using A = at::opmath_type<T>;
  using V = Vec<A>;
  const T* ys = static_cast<const T*>(io.y);
  const T* gs = static_cast<const T*>(io.dy);
  T* dxs = static_cast<T*>(io.dx);
  const V scale(static_cast<A>(shape.scale));
  const int64_t n = shape.n;
  at::parallel_for(0, shape.rows, cpu::row_grain(n), [&](int64_t begin, int64_t end) {
    RowBuffers<T> buffers;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t valid = shape.causal ? r % shape.causal + 1 : n;
      if constexpr (!std::is_same_v<T, A>) {
        half_softmax_backward_row(ys + r * n, gs + r * n, dxs + r * n, valid, n, static_cast<float>(shape.scale));
        continue;
      }
      const A* yrow = cpu::widen(ys + r * n, valid, buffers.in);
      const A* grow = cpu::widen(gs + r * n, valid, buffers.grad);
      V dot(0);
      cpu::for_each_vector<A>(valid, [&](int64_t i, int64_t count) {
        dot = dot + V::loadu(yrow + i, count) * V::loadu(grow + i, count);
      });
      const V row_dot(at::vec::vec_reduce_all([](V a, V b) { return a + b; }, dot));
      A* out = output_row(dxs + r * n, buffers.out, n);
      cpu::for_each_vector<A>(valid, [&](int64_t i, int64_t count) {
        (scale * V::loadu(yrow + i, count) * (V::loadu(grow + i, count) - row_dot)).store(out + i, count);
      });
      std::fill(out + valid, out + n, A(0));
      cpu::narrow(out, dxs + r * n, n);
    }
  });
}

void norm_forward_cpu(const NormShape& shape, const NormForwardBuffers<>& io, double eps) {
  cpu::with_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_param_type<T>(shape, [&](auto param) {
      norm_forward_rows(shape, typed<T, at::opmath_type<T>, typename decltype(param)::type>(io), eps);
    });
  });
}

void norm_backward_cpu(const NormShape& shape, const NormBackwardBuffers<>& io, const NormParamGrads& grads) {
  cpu::with_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_param_type<T>(shape, [&](auto param) {
      norm_backward_rows(shape, typed<T, at::opmath_type<T>, typename decltype(param)::type>(io), grads);
    });
  });
}

void softmax_forward_cpu(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io) {
  cpu::with_floating(shape.dtype, [&](auto tag) { softmax_forward_rows<typename decltype(tag)::type>(shape, io); });
}

void softmax_backward_cpu(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io) {
  cpu::with_floating(shape.dtype, [&](auto tag) { softmax_backward_rows<typename decltype(tag)::type>(shape, io); });
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(norm_forward_stub, CPU, norm_forward_cpu);
FASTREDUCE_REGISTER_KERNEL(norm_backward_stub, CPU, norm_backward_cpu);
FASTREDUCE_REGISTER_KERNEL(softmax_forward_stub, CPU, softmax_forward_cpu);
FASTREDUCE_REGISTER_KERNEL(softmax_backward_stub, CPU, softmax_backward_cpu);

}  // namespace fastreduce
