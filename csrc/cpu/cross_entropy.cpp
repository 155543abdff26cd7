// CPU cross-entropy, a row per task: the row widened to the accumulator type
// once, then max, sum of exponentials and (label smoothing) the plain sum on
// at::vec vectors. Same formulas as the CUDA kernels
// (cross_entropy_kernels.cuh); row losses are summed in row order.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "../kernels/cross_entropy_target.h"
#include "../torch/common.h"
#include "../torch/kernels.h"
#include "vec.h"

namespace fastreduce {
namespace {

using cpu::Vec;

// log(sum(exp(row))) as its two terms, the largest logit and
// log(sum(exp(row - largest))), so that a loss can take (largest - x[t]) first
// and huge logits do not cancel; the second is NaN with any NaN or +inf.
template <typename A>
std::pair<A, A> log_sum_exp(const A* row, int64_t classes) {
  using V = Vec<A>;
  const A top = at::vec::reduce_all<A>([](V a, V b) { return at::vec::maximum(a, b); }, row, classes);
  if (top == -std::numeric_limits<A>::infinity() || std::isnan(top)) return {top, A(0)};
  const A total = at::vec::map_reduce_all<A>([top](V v) { return (v - V(top)).exp(); },
                                             [](V a, V b) { return a + b; }, row, classes);
  return {top, std::log(total)};
}

// A row holding +inf has lse +inf, as torch.logsumexp (its log_sum, and so
// its loss and gradient, stay NaN); -inf rows give -inf.
template <typename A>
A row_lse(A top, A log_sum) {
  return std::isinf(top) ? top : top + log_sum;
}

// The backward's exp(x - shift): NaN for a +inf row, as torch's softmax there.
template <typename A>
A gradient_shift(A lse) {
  return lse == std::numeric_limits<A>::infinity() ? std::numeric_limits<A>::quiet_NaN() : lse;
}

// The divisor of the summed row losses: for a mean the rows not ignored (none:
// 0, and the mean 0 / 0 = NaN, as torch), for a sum 1.
template <typename A>
A loss_divisor(const int64_t* targets, const CrossEntropyShape& args) {
  if (args.reduction != 1) return A(1);
  A kept = 0;
  for (int64_t r = 0; r < args.rows; ++r) kept += targets[r] != args.ignore_index;
  return kept;
}

// The loss from the row losses, summed in row order.
template <typename T, typename A>
T reduced_loss(const A* losses, int64_t rows, A divisor) {
  return static_cast<T>(std::accumulate(losses, losses + rows, A(0)) / divisor);
}

// A class index the rows can hold, or torch's error (the CPU stops at a bad
// target, as torch's CPU loss; the CUDA kernels give NaN, having no host to
// ask without a sync).
void check_class(int64_t t, int64_t classes, const char* op) {
  TORCH_CHECK(t >= 0 && t < classes, op, ": argument 'target' holds class ", to_text(t), ", outside [0, ",
              to_text(classes), ")");
}

// A kept row's loss from its log-sum-exp terms: (1 - eps) (lse - x[t]) +
// eps (lse - mean x), each lse difference taken from the largest logit first.
template <typename A>
A row_loss_of(const A* row, int64_t classes, int64_t t, A top, A log_sum, A smoothing) {
  const A smooth = smoothing == A(0) ? A(0) : smoothing * ((top - cpu::sum(row, classes) / classes) + log_sum);
  return (A(1) - smoothing) * ((top - row[t]) + log_sum) + smooth;
}

// out = soft * exp(row - shift) - uniform over the row, vector by vector;
// the caller subtracts the target's term.
template <typename A>
void write_gradient_row(const A* row, int64_t classes, A soft, A shift, A uniform, A* out) {
  using V = Vec<A>;
  const V s(soft), m(shift), u(uniform);
  int64_t i = 0;
  for (; i + V::size() <= classes; i += V::size()) (s * (V::loadu(row + i) - m).exp() - u).store(out + i);
  if (i < classes) (s * (V::loadu(row + i, classes - i) - m).exp() - u).store(out + i, classes - i);
}

template <typename T>
void forward_rows(const CrossEntropyShape& args, const CrossEntropyForwardBuffers& io) {
  using A = at::opmath_type<T>;
  const T* xs = static_cast<const T*>(io.logits);
  const int64_t* targets = io.target;
  A* lses = static_cast<A*>(io.lse);
  const int64_t classes = args.classes;
  const A smoothing = static_cast<A>(args.label_smoothing);
  std::vector<A> row_loss(args.rows);
  at::parallel_for(0, args.rows, cpu::row_grain(classes), [&](int64_t begin, int64_t end) {
    std::vector<A> buffer;
    for (int64_t r = begin; r < end; ++r) {
      const A* row = cpu::widen(xs + r * args.row_stride, classes, buffer);
      const auto [top, log_sum] = log_sum_exp(row, classes);
      lses[r] = row_lse(top, log_sum);
      const int64_t t = targets[r];
      if (t == args.ignore_index) {
        row_loss[r] = 0;
        continue;
      }
      check_class(t, classes, args.op);
      row_loss[r] = row_loss_of(row, classes, t, top, log_sum, smoothing);
    }
  });
  T* out = static_cast<T*>(io.loss);
  if (args.reduction == 0) {
    std::transform(row_loss.begin(), row_loss.end(), out, [](A v) { return static_cast<T>(v); });
    return;
  }
  *out = reduced_loss<T>(row_loss.data(), args.rows, loss_divisor<A>(targets, args));
}

template <typename T>
void backward_rows(const CrossEntropyShape& args, const CrossEntropyBackwardBuffers& io) {
  using A = at::opmath_type<T>;
  const T* xs = static_cast<const T*>(io.logits);
  const int64_t* targets = io.target;
  const A* lses = static_cast<const A*>(io.lse);
  const A* grad_lses = static_cast<const A*>(io.grad_lse);
  const T* grads = static_cast<const T*>(io.grad_loss);
  T* dxs = static_cast<T*>(io.grad_input);
  const int64_t classes = args.classes;
  const A smoothing = static_cast<A>(args.label_smoothing);
  A scale = 0;  // mean and sum: one gradient for every row
  if (args.reduction != 0)
    scale = static_cast<A>(grads[0]) / loss_divisor<A>(targets, args);
  at::parallel_for(0, args.rows, cpu::row_grain(classes), [&](int64_t begin, int64_t end) {
    std::vector<A> buffer, out_buffer(std::is_same_v<T, A> ? 0 : classes);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = targets[r];
      if (t != args.ignore_index) check_class(t, classes, args.op);
      const A g = t == args.ignore_index ? A(0) : args.reduction == 0 ? static_cast<A>(grads[r]) : scale;
      const A* row = cpu::widen(xs + r * args.row_stride, classes, buffer);
      A* out = std::is_same_v<T, A> ? reinterpret_cast<A*>(dxs + r * args.row_stride) : out_buffer.data();
      const A smooth = g * smoothing / static_cast<A>(classes);
      write_gradient_row(row, classes, g + (grad_lses ? grad_lses[r] : A(0)), gradient_shift(lses[r]), smooth, out);
      if (t != args.ignore_index) out[t] -= target_hit(g, smoothing, classes, smooth);
      cpu::narrow(out, dxs + r * args.row_stride, classes);
    }
  });
}

// The gradient of grad_scale times the summed (or, for a mean, averaged)
// row losses, with the lse, the row losses (the accumulator type) and their
// sum or mean, a row at a time: the row is widened once and read from that
// buffer for all three. grad_input may be the logits.
template <typename T>
void with_grad_rows(const CrossEntropyShape& args, const CrossEntropyWithGradBuffers& io) {
  using A = at::opmath_type<T>;
  const T* xs = static_cast<const T*>(io.logits);
  const int64_t* targets = io.target;
  const A divisor = loss_divisor<A>(targets, args);
  // A mean over no kept rows makes g inf: then every row's gradient is 0.
  const A g = (io.grad_scale ? *static_cast<const A*>(io.grad_scale) : A(1)) / divisor;
  A* lses = static_cast<A*>(io.lse);
  std::vector<A> own_losses(io.row_loss ? 0 : args.rows);
  A* losses = io.row_loss ? static_cast<A*>(io.row_loss) : own_losses.data();
  T* dxs = static_cast<T*>(io.grad_input);
  const int64_t classes = args.classes;
  const A smoothing = static_cast<A>(args.label_smoothing);
  at::parallel_for(0, args.rows, cpu::row_grain(classes), [&](int64_t begin, int64_t end) {
    std::vector<A> buffer, out_buffer(classes);
    for (int64_t r = begin; r < end; ++r) {
      const A* row = cpu::widen(xs + r * args.row_stride, classes, buffer);
      const auto [top, log_sum] = log_sum_exp(row, classes);
      const A lse = row_lse(top, log_sum);
      if (lses) lses[r] = lse;
      const int64_t t = targets[r];
      A* out = out_buffer.data();
      if (t == args.ignore_index) {
        // 0 times the row's softmax, whatever the scale (inf for a mean over
        // no kept rows): NaN where the softmax is (rows holding NaN or +inf,
        // or only -inf), as torch's gradient and the separate backward's.
        losses[r] = 0;
        write_gradient_row(row, classes, A(0), gradient_shift(lse), A(0), out);
      } else {
        check_class(t, classes, args.op);
        losses[r] = row_loss_of(row, classes, t, top, log_sum, smoothing);
        const A smooth = g * smoothing / static_cast<A>(classes);
        write_gradient_row(row, classes, g, gradient_shift(lse), smooth, out);
        out[t] -= target_hit(g, smoothing, classes, smooth);
      }
      cpu::narrow(out, dxs + r * args.row_stride, classes);
    }
  });
  if (io.loss) *static_cast<T*>(io.loss) = reduced_loss<T>(losses, args.rows, divisor);
}

void cross_entropy_forward_cpu(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io) {
  cpu::with_floating(shape.dtype, [&](auto tag) { forward_rows<typename decltype(tag)::type>(shape, io); });
}

void cross_entropy_backward_cpu(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io) {
  cpu::with_floating(shape.dtype, [&](auto tag) { backward_rows<typename decltype(tag)::type>(shape, io); });
}

void cross_entropy_with_grad_cpu(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io) {
  cpu::with_floating(shape.dtype, [&](auto tag) { with_grad_rows<typename decltype(tag)::type>(shape, io); });
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(cross_entropy_forward_stub, CPU, cross_entropy_forward_cpu);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_backward_stub, CPU, cross_entropy_backward_cpu);
FASTREDUCE_REGISTER_KERNEL(cross_entropy_with_grad_stub, CPU, cross_entropy_with_grad_cpu);

}  // namespace fastreduce
