// CPU reductions over the dense (outer, len, inner) view, with the same op
// abstraction as the CUDA kernels. Floating types run on at::vec vectors
// (float16/bfloat16 widened to float block by block); integer types on
// independent scalar lanes the compiler vectorizes. Work is cut into
// fixed-size pieces, never by thread count, so results do not depend on the
// number of threads.
#include <ATen/Parallel.h>

#include <array>
#include <limits>
#include <vector>

#include "../torch/common.h"
#include "../torch/kernels.h"
#include "../kernels/selection_ops.h"
#include "../kernels/statistic_ops.h"
#include "vec.h"

namespace fastreduce {
namespace {

using cpu::Vec;
using cpu::VecOp;

constexpr int64_t kBlock = 4096;         // elements folded into vector lanes before they join the total
constexpr int kPack = 16;                // elements an op with fold_pack (Welford, any/all) takes at once
constexpr int64_t kFullChunk = 1 << 16;  // slice of a full reduction per parallel task
constexpr int64_t kStrip = 2048;         // columns of one column task: a contiguous 8 KiB of floats per row
constexpr int64_t kColumnPartials = 32;  // runs of rows a column reduction is cut into, at most

// Folds x[0, n) on 16 independent scalar lanes, which the compiler
// vectorizes where one running accumulator would wait on every add:
// integers, and the vector norms. (32 lanes of double no longer fit in
// registers: the loop then waits on stores.)
template <typename Op, typename In>
typename Op::acc_t fold_lanes(const Op& op, const In* x, int64_t n) {
  constexpr int kLanes = 16;
  std::array<typename Op::acc_t, kLanes> lanes;
  lanes.fill(Op::identity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = op.fold(lanes[l], x[i + l], 0);
  auto acc = cpu::combine_all<Op>(lanes.data(), kLanes);
  for (; i < n; ++i) acc = op.fold(acc, x[i], 0);
  return acc;
}

template <typename Op>
constexpr bool kLaneFolded = false;
template <typename A, NormOrder kOrder>
constexpr bool kLaneFolded<NormOp<A, kOrder>> = true;
template <typename Op>
constexpr bool kTwoNorm = false;
template <typename A>
constexpr bool kTwoNorm<NormOp<A, NormOrder::Two>> = true;

// Whether n float16/bfloat16 values are all zero (either sign): their bits
// or-ed, the sign masked (a loop the compiler vectorizes).
template <typename In>
bool all_zero(const In* x, int64_t n) {
  uint16_t bits = 0;
  for (int64_t i = 0; i < n; ++i) bits |= x[i].x;
  return (bits & 0x7fff) == 0;
}

// A block of a norm. The 2-norm of float and half types sums squares in
// float vectors straight from the input; a half type's keeps a double
// accumulator (a bfloat16 of 1e20 squared overflows float, one of 1e-25
// underflows), so its block is summed again in double where float
// overflowed or the sum is below 2^-60 (where squares under float's normal
// range could weigh) and the block is not all zero. The other orders and
// double fold on lanes, half types widened to float first.
template <typename Op, typename In>
typename Op::acc_t fold_norm_block(const Op& op, const In* x, int64_t n) {
  if constexpr (kTwoNorm<Op> && !std::is_same_v<In, double>) {
    const float squares = cpu::fold_vectors<SumOp<float>>(x, n, [](const auto& v) { return v * v; });
    if constexpr (std::is_same_v<typename Op::acc_t, float>) return squares;
    else if (std::isfinite(squares) && squares >= 0x1p-60f) return squares;
    else if (squares == 0 && all_zero(x, n)) return 0;
  }
  thread_local std::vector<at::opmath_type<In>> buffer;
  return fold_lanes(op, cpu::widen(x, n, buffer), n);
}

template <typename Op>
constexpr bool kLogSumExp = false;
template <typename A>
constexpr bool kLogSumExp<LogSumExpOp<A>> = true;

// exp(x - top), exactly 1 where x == top: infinities never see inf - inf.
template <typename A>
Vec<A> exp_against(const Vec<A>& x, const Vec<A>& top) {
  return Vec<A>::blendv((x - top).exp(), Vec<A>(A(1)), x == top);
}

// logsumexp's (max, sum) of a contiguous block: its maximum, then one exp
// per element against it.
template <typename A, typename In>
MaxAndSum<A> logsumexp_block(const In* x, int64_t n) {
  using V = Vec<A>;
  thread_local std::vector<A> buffer;
  const A* values = cpu::widen(x, n, buffer);
  const A top = cpu::fold_vectors<MaxOp<A>>(values, n);
  V sums(A(0));
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) sums = sums + exp_against(V::loadu(values + i), V(top));
  std::array<A, V::size()> parts;
  sums.store(parts.data());
  A sum = cpu::combine_all<SumOp<A>>(parts.data(), V::size());
  for (; i < n; ++i) sum += LogSumExpOp<A>::scaled(A(1), values[i], top);
  return {top, sum};
}

// Rows [0, rows) of `width` columns (row stride `inner`) folded into running
// (max, sum) columns, kGroup rows at a time: the group's maximum first, then
// one exp per element against it (the group's rows are still in L1), and the
// running sum rescaled once a group rather than at every new maximum.
template <typename A, typename In>
void logsumexp_rows_into(const In* x, int64_t rows, int64_t inner, int64_t width, A* top, A* sum) {
  using V = Vec<A>;
  constexpr int64_t kGroup = 16;
  thread_local std::vector<A> buffer;
  std::array<const A*, kGroup> row;
  for (int64_t r0 = 0; r0 < rows; r0 += kGroup) {
    const int64_t count = std::min(kGroup, rows - r0);
    if constexpr (!std::is_same_v<In, A>) buffer.resize(count * width);
    for (int64_t g = 0; g < count; ++g) {
      if constexpr (std::is_same_v<In, A>) {
        row[g] = x + (r0 + g) * inner;
      } else {
        cpu::convert(x + (r0 + g) * inner, buffer.data() + g * width, width);
        row[g] = buffer.data() + g * width;
      }
    }
    int64_t c = 0;
    for (; c + V::size() <= width; c += V::size()) {
      const V old_top = V::loadu(top + c), old_sum = V::loadu(sum + c);
      V new_top = old_top;
      for (int64_t g = 0; g < count; ++g) new_top = at::vec::maximum(new_top, V::loadu(row[g] + c));
      V total = V::blendv(old_sum * (old_top - new_top).exp(), old_sum, old_top == new_top);
      for (int64_t g = 0; g < count; ++g) total = total + exp_against(V::loadu(row[g] + c), new_top);
      total.store(sum + c);
      new_top.store(top + c);
    }
    for (; c < width; ++c) {
      MaxAndSum<A> folded{top[c], sum[c]};
      for (int64_t g = 0; g < count; ++g) folded = LogSumExpOp<A>{}.fold(folded, row[g][c], 0);
      top[c] = folded.max;
      sum[c] = folded.sum;
    }
  }
}

template <typename Op>
constexpr bool kMoments = false;
template <typename A>
constexpr bool kMoments<VarOp<A>> = true;

// The Welford moments of a contiguous block as VarOp::fold_pack takes a
// pack, in two vector passes over it (in L1, cpu::sum as the CPU norms take
// theirs): the sum of x - shift, then of the squared deviations from the
// block's mean; the caller merges the block once. shift: the running
// moments' own, or the block's first value.
template <typename A, typename In>
Moments<A> moments_block(const In* x, int64_t n, const Moments<A>& acc) {
  thread_local std::vector<A> buffer;
  const A* values = cpu::widen(x, n, buffer);
  const A shift = acc.count == A(0) ? values[0] : acc.shift;
  const A mean = cpu::sum(values, n, [shift](auto v) { return v - decltype(v)(shift); }) / A(n);
  const A m2 = cpu::sum(values, n, [shift, mean](auto v) {
    const auto deviation = v - decltype(v)(shift) - decltype(v)(mean);
    return deviation * deviation;
  });
  return {A(n), shift, mean, m2};
}

// Rows [r0, r1) of the `width` columns starting at x (row stride `inner`) as
// one run's Welford moments a column, in two passes over the rows with the
// columns in vectors: the sums of x - shift (shift: the run's first row),
// then of the squared deviations from each column's mean.
template <typename A, typename In>
void moment_rows_into(const In* x, int64_t r0, int64_t r1, int64_t inner, int64_t width, Moments<A>* partial) {
  using V = Vec<A>;
  thread_local std::vector<A> shift, mean, m2, row;
  const A* first = cpu::widen(x + r0 * inner, width, row);
  shift.assign(first, first + width);
  mean.assign(width, A(0));
  m2.assign(width, A(0));
  // Adds map(values, shift, mean) of every row to `into`, column by column
  // (rows widened through a buffer: float moments are double here, which
  // for_each_widened does not give).
  auto add_rows = [&](std::vector<A>& into, auto map) {
    for (int64_t r = r0; r < r1; ++r) {
      const A* values = cpu::widen(x + r * inner, width, row);
      int64_t c = 0;
      for (; c + V::size() <= width; c += V::size()) {
        const V term = map(V::loadu(values + c), V::loadu(shift.data() + c), V::loadu(mean.data() + c));
        (V::loadu(into.data() + c) + term).store(into.data() + c);
      }
      for (; c < width; ++c) into[c] += map(values[c], shift[c], mean[c]);
    }
  };
  add_rows(mean, [](const auto& v, const auto& s, const auto&) { return v - s; });
  const A count = A(r1 - r0);
  for (int64_t c = 0; c < width; ++c) mean[c] /= count;
  add_rows(m2, [](const auto& v, const auto& s, const auto& mu) {
    const auto deviation = v - s - mu;
    return deviation * deviation;
  });
  for (int64_t c = 0; c < width; ++c) partial[c] = {count, shift[c], mean[c], m2[c]};
}

template <typename Op>
constexpr bool kArgExtremum = false;
template <typename V, bool kMax>
constexpr bool kArgExtremum<ArgExtremumOp<V, kMax>> = true;

// argmax/argmin of x[0, n) (indices from first_index) joined to acc: the
// block's extreme on vectors (floating) or lanes (integers), then its first
// index only where it can win (fold_run's way, a block at a time).
template <typename Op, typename In>
typename Op::acc_t arg_extremum_block(const In* x, int64_t n, int64_t first_index, typename Op::acc_t acc) {
  using V = decltype(acc.value);
  using Extreme = typename Op::Extreme;
  V top;
  if constexpr (std::is_floating_point_v<V>) top = cpu::fold_vectors<Extreme>(x, n);
  else top = fold_lanes(Extreme{}, x, n);
  return Op::join_extreme(acc, top, x, n, first_index);
}

template <typename Op>
constexpr bool kVectorized = false;
template <typename A>
constexpr bool kVectorized<SumOp<A>> = true;
template <typename A>
constexpr bool kVectorized<MeanOp<A>> = true;
template <typename A>
constexpr bool kVectorized<ProdOp<A>> = true;
template <typename A>
constexpr bool kVectorized<MaxOp<A>> = true;
template <typename A>
constexpr bool kVectorized<MinOp<A>> = true;

// Folds x[0, n), whose first element has index first_index, block by block
// (error grows with the block count, not n). Ops with a vector form fold
// floating types straight from the input (half types widened in registers)
// and integers on lanes; norms on lanes, logsumexp and var's moments in
// vectors; argmax/argmin take each block's extreme first. The rest fold a
// pack (fold_pack) or an element at a time within a block (a float32 Welford
// run over a million elements drifts by 5e-4; in blocks, 1e-6).
template <typename Op, typename In>
typename Op::acc_t fold_contiguous(const Op& op, const In* x, int64_t n, int64_t first_index) {
  using Acc = typename Op::acc_t;
  Acc acc = Op::identity();
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t count = std::min(kBlock, n - start);
    if constexpr (kVectorized<Op> && std::is_floating_point_v<Acc>) {
      acc = Op::combine(acc, cpu::fold_vectors<Op>(x + start, count));
    } else if constexpr (kVectorized<Op>) {
      acc = Op::combine(acc, fold_lanes(op, x + start, count));
    } else if constexpr (kLaneFolded<Op>) {
      acc = Op::combine(acc, fold_norm_block(op, x + start, count));
    } else if constexpr (kLogSumExp<Op>) {
      acc = Op::combine(acc, logsumexp_block<decltype(Acc::max)>(x + start, count));
    } else if constexpr (kMoments<Op>) {
      acc = Op::combine(acc, moments_block(x + start, count, acc));
    } else if constexpr (kArgExtremum<Op>) {
      acc = arg_extremum_block<Op>(x + start, count, first_index + start, acc);
    } else {
      Acc block = Op::identity();
      int64_t i = start;
      if constexpr (FoldsPacks<Op, In, kPack>::value)
        for (; i + kPack <= start + count; i += kPack)
          block = op.fold_pack(block, *reinterpret_cast<const In(*)[kPack]>(x + i), first_index + i);
      for (; i < start + count; ++i) block = op.fold(block, x[i], first_index + i);
      acc = Op::combine(acc, block);
    }
  }
  return acc;
}

// Rows [r0, r1) of columns [c0, c0 + width) folded into `partial`, row by
// row: each row is contiguous, so the loads stream and the vectors stay full.
template <typename Op, typename In>
void fold_rows_into(const Op& op, const In* x, int64_t r0, int64_t r1, int64_t inner, int64_t c0, int64_t width,
                    typename Op::acc_t* partial) {
  using Acc = typename Op::acc_t;
  if constexpr (kLogSumExp<Op>) {
    using A = decltype(Acc::max);
    thread_local std::vector<A> top, sum;
    top.assign(width, -std::numeric_limits<A>::infinity());
    sum.assign(width, A(0));
    logsumexp_rows_into(x + r0 * inner + c0, r1 - r0, inner, width, top.data(), sum.data());
    for (int64_t c = 0; c < width; ++c) partial[c] = {top[c], sum[c]};
    return;
  }
  if constexpr (kMoments<Op>) {
    moment_rows_into(x + c0, r0, r1, inner, width, partial);
    return;
  }
  if constexpr (FoldsLater<Op, In>::value) {
    // argmax: after the run's first row every row is a later one
    // (fold_later), folded into values and indices kept apart, whose
    // selects the compiler vectorizes.
    if (r0 >= r1) {
      std::fill(partial, partial + width, Op::identity());
      return;
    }
    using V = decltype(Acc::value);
    thread_local std::vector<V> best;
    thread_local std::vector<int64_t> where;
    best.resize(width);
    where.resize(width);
    for (int64_t c = 0; c < width; ++c) {
      const Acc first = op.fold(Op::identity(), x[r0 * inner + c0 + c], r0);
      best[c] = first.value;
      where[c] = first.index;
    }
    for (int64_t r = r0 + 1; r < r1; ++r) {
      const In* source = x + r * inner + c0;
      V* const b = best.data();
      int64_t* const w = where.data();
      for (int64_t c = 0; c < width; ++c) {
        const Acc next = op.fold_later(Acc{b[c], w[c]}, source[c], r);
        b[c] = next.value;
        w[c] = next.index;
      }
    }
    for (int64_t c = 0; c < width; ++c) partial[c] = {best[c], where[c]};
    return;
  }
  std::fill(partial, partial + width, Op::identity());
  for (int64_t r = r0; r < r1; ++r) {
    const In* source = x + r * inner + c0;
    if constexpr (kVectorized<Op> && std::is_floating_point_v<Acc>) {
      // Half types widened in registers: a row buffer's store and reload
      // an element doubled the time (sum dim 0 of (8192, 768) bfloat16:
      // 0.218 against 0.110 ms).
      cpu::for_each_widened(source, width, [&](int64_t c, int64_t count, const Vec<Acc>& v) {
        VecOp<Op>::combine(Vec<Acc>::loadu(partial + c, count), v).store(partial + c, count);
      });
    } else {
      for (int64_t c = 0; c < width; ++c) partial[c] = op.fold(partial[c], source[c], r);
    }
  }
}

template <typename Op, typename In, typename Sink>
void reduce_typed(const Op& op, const In* x, int64_t outer, int64_t len, int64_t inner, Sink out) {
  using Acc = typename Op::acc_t;
  if (inner == 1 && outer == 1) {
    const int64_t chunks = (len + kFullChunk - 1) / kFullChunk;
    std::vector<Acc> partial(chunks);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t start = c * kFullChunk;
        partial[c] = fold_contiguous(op, x + start, std::min(kFullChunk, len - start), start);
      }
    });
    op.store(out, 0, cpu::combine_all<Op>(partial.data(), chunks));
  } else if (inner == 1) {
    at::parallel_for(0, outer, std::max<int64_t>(1, kFullChunk / std::max<int64_t>(len, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t o = begin; o < end; ++o) op.store(out, o, fold_contiguous(op, x + o * len, len, 0));
                     });
  } else {
    // Columns: the rows are cut into at most kColumnPartials fixed runs and
    // the columns into strips; each task folds one run of one strip into a
    // partial row, then each column folds its partials in order.
    const int64_t run = std::max<int64_t>(64, (len + kColumnPartials - 1) / kColumnPartials);
    const int64_t runs = (len + run - 1) / run;
    const int64_t strips = (inner + kStrip - 1) / kStrip;
    std::vector<Acc> partials(outer * runs * inner);
    at::parallel_for(0, outer * runs * strips, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t strip = task % strips, p = task / strips % runs, o = task / strips / runs;
        const int64_t c0 = strip * kStrip, r0 = p * run;
        fold_rows_into(op, x + o * len * inner, r0, std::min(len, r0 + run), inner, c0,
                       std::min(kStrip, inner - c0), partials.data() + (o * runs + p) * inner + c0);
      }
    });
    at::parallel_for(0, outer * inner, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t o = i / inner, c = i % inner;
        Acc acc = Op::identity();
        for (int64_t p = 0; p < runs; ++p) acc = Op::combine(acc, partials[(o * runs + p) * inner + c]);
        op.store(out, i, acc);
      }
    });
  }
}

template <typename Sink>
Sink make_sink(void* output, void* second) {
  if constexpr (std::is_pointer_v<Sink>) {
    return static_cast<Sink>(output);
  } else {
    using First = std::remove_pointer_t<decltype(Sink::first)>;
    using Second = std::remove_pointer_t<decltype(Sink::second)>;
    return {static_cast<First*>(output), static_cast<Second*>(second)};
  }
}

void reduce_cpu(const ReduceProblem& p, void* output) {
  auto run = [&](auto op, auto in, auto sink) {
    using In = typename decltype(in)::type;
    reduce_typed(op, static_cast<const In*>(p.input), p.outer, p.len, p.inner,
                 make_sink<typename decltype(sink)::type>(output, p.second_output));
    return true;
  };
  bool done = visit_reduction<c10::Half, c10::BFloat16>(p.kind, p.dtype, false, [&](auto k, auto tag) {
    using Types = ReduceTypes<decltype(k)::value, typename decltype(tag)::type>;
    return run(Types::op_t::make(p.params, p.len), tag, TypeTag<typename Types::out_t*>{});
  });
  if (!done) done = visit_statistic<c10::Half, c10::BFloat16, true>(p.kind, p.dtype, p.params, p.len, false, run);
  if (!done) done = visit_selection<c10::Half, c10::BFloat16>(p.kind, p.dtype, false, run);
  TORCH_CHECK(done, "fastreduce: no CPU kernel for reduction ", to_text(static_cast<int64_t>(p.kind)), " of dtype ",
              to_text(static_cast<int64_t>(p.dtype)));
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(reduce_stub, CPU, reduce_cpu);

}  // namespace fastreduce
