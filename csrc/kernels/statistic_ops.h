// The ops of var/std (Welford moments), logsumexp (running max and scaled
// sum) and vector norms, on the contract of reduce_op.h. Torch-free and
// CUDA-free: the CPU path folds with the same code.
#pragma once

#include "reduce_op.h"

namespace fastreduce {

// (count, mean, M2) of a run of elements, the mean kept relative to the
// run's first element (`shift`): the running mean of data far from zero
// then rounds at the scale of its spread, not of its magnitude. Two runs
// merge exactly (Chan et al.), so partials combine in any fixed grouping,
// and no sum of squares cancels against a large mean.
template <typename A>
struct Moments {
  A count, shift, mean, m2;
};

// var, std, and with a second sink the mean: var = M2 / max(len - correction, 0).
template <typename A>
struct VarOp {
  using acc_t = Moments<A>;
  A inv_divisor;  // inf when the divisor is 0: M2 / 0 as torch computes it
  bool root;
  FR_HOST_DEVICE static acc_t identity() { return {A(0), A(0), A(0), A(0)}; }
  FR_HOST_DEVICE static acc_t combine(acc_t a, acc_t b) {
    if (b.count == A(0)) return a;
    if (a.count == A(0)) return b;
    const A count = a.count + b.count;
    const A share = b.count / count;
    const A delta = (b.shift - a.shift) + (b.mean - a.mean);
    return {count, a.shift, a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.count * share};
  }
  template <typename In>
  FR_HOST_DEVICE acc_t fold(acc_t acc, In x, int64_t) const {
    const A raw = widen_to<A>(x);
    const A shift = acc.count == A(0) ? raw : acc.shift;
    const A value = raw - shift;
    const A count = acc.count + A(1);
    const A delta = value - acc.mean;
    const A mean = acc.mean + delta / count;
    return {count, shift, mean, acc.m2 + delta * (value - mean)};
  }
  // A pack's own moments (two short passes in registers), merged once.
  template <typename In, int N>
  FR_HOST_DEVICE acc_t fold_pack(acc_t acc, const In (&pack)[N], int64_t) const {
    A raw[N];
    for (int k = 0; k < N; ++k) raw[k] = widen_to<A>(pack[k]);
    const A shift = acc.count == A(0) ? raw[0] : acc.shift;
    A sum = A(0);
    for (int k = 0; k < N; ++k) sum += raw[k] - shift;
    const A mean = sum * (A(1) / A(N));
    A m2 = A(0);
    for (int k = 0; k < N; ++k) {
      const A deviation = raw[k] - shift - mean;
      m2 += deviation * deviation;
    }
    return combine(acc, {A(N), shift, mean, m2});
  }
  template <typename Out>
  FR_HOST_DEVICE void store(PairSink<Out> out, int64_t i, acc_t acc) const {
    const A var = acc.m2 * inv_divisor;  // 0 * inf: NaN, as torch's 0 / 0
    out.first[i] = static_cast<Out>(root ? std::sqrt(var) : var);
    if (out.second) out.second[i] = static_cast<Out>(acc.shift + acc.mean);
  }
  static VarOp make(const ReduceParams& params, int64_t len) {
    const double divisor = static_cast<double>(len) - params.correction;
    return {static_cast<A>(divisor > 0 ? 1.0 / divisor : std::numeric_limits<double>::infinity()), params.root};
  }
};

// exp(x) for x <= 0 (or -inf, or NaN): the GPU's ex2 unit for float (a
// few ulp, on a sum of terms at most 1), std::exp elsewhere.
template <typename A>
FR_HOST_DEVICE A exp_nonpositive(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) return __expf(x);
#endif
  return std::exp(x);
}

template <typename A>
struct MaxAndSum {
  A max, sum;  // the row is sum * exp(max) worth of exp()
};

// log(sum(exp(x))) in one pass: the running maximum rescales the sum when it
// grows. Equal maxima skip the exp, so -inf and +inf rows never see inf - inf;
// a NaN poisons the sum and stays.
template <typename A>
struct LogSumExpOp : ElementwiseOp<LogSumExpOp<A>, MaxAndSum<A>> {
  using acc_t = MaxAndSum<A>;
  FR_HOST_DEVICE static acc_t identity() { return {-std::numeric_limits<A>::infinity(), A(0)}; }
  FR_HOST_DEVICE static A scaled(A sum, A from, A to) { return from == to ? sum : sum * exp_nonpositive(from - to); }
  FR_HOST_DEVICE static acc_t combine(acc_t a, acc_t b) {
    const A top = MaxOp<A>::combine(a.max, b.max);
    return {top, scaled(a.sum, a.max, top) + scaled(b.sum, b.max, top)};
  }
  template <typename In>
  FR_HOST_DEVICE acc_t fold(acc_t acc, In x, int64_t) const {
    const A value = widen_to<A>(x);
    if (value > acc.max) return {value, scaled(acc.sum, acc.max, value) + A(1)};
    return {acc.max, acc.sum + scaled(A(1), value, acc.max)};
  }
  // A pack: its maximum, then one exp per element against it, merged with
  // one rescale. fmax skips NaN, so a finite maximum means the pack holds no
  // infinity, and a NaN element still poisons the sum through its exp: there
  // the plain exp suffices (rows are issue-bound on these instructions). A pack
  // holding an infinity (or only NaN) takes the exact form: 1 where an
  // element equals the NaN-propagating maximum, so infinities stay exact.
  template <typename In, int N>
  FR_HOST_DEVICE acc_t fold_pack(acc_t acc, const In (&pack)[N], int64_t) const {
    A raw[N];
    for (int k = 0; k < N; ++k) raw[k] = widen_to<A>(pack[k]);
    A top = raw[0];
    for (int k = 1; k < N; ++k) top = std::fmax(top, raw[k]);
    A sum = A(0);
    if (std::isfinite(top)) {
      for (int k = 0; k < N; ++k) sum += exp_nonpositive(raw[k] - top);
    } else {
      top = raw[0];
      for (int k = 1; k < N; ++k) top = MaxOp<A>::combine(top, raw[k]);
      for (int k = 0; k < N; ++k) sum += scaled(A(1), raw[k], top);
    }
    return combine(acc, {top, sum});
  }
  FR_HOST_DEVICE A finalize(acc_t acc) const { return acc.max + std::log(acc.sum); }
};

enum class NormOrder { Zero, One, Two, Inf, NegInf, Other };

// torch.linalg.vector_norm: ord 0 counts non-zeros, +-inf take the largest
// or smallest |x|, any other p sums |x|^p and takes the p-th root.
template <typename A, NormOrder kOrder>
struct NormOp : ElementwiseOp<NormOp<A, kOrder>, A> {
  A p, inv_p;
  FR_HOST_DEVICE static A identity() {
    return kOrder == NormOrder::NegInf ? std::numeric_limits<A>::infinity() : A(0);
  }
  FR_HOST_DEVICE static A combine(A a, A b) {
    if constexpr (kOrder == NormOrder::Inf) return MaxOp<A>::combine(a, b);
    else if constexpr (kOrder == NormOrder::NegInf) return MinOp<A>::combine(a, b);
    else return a + b;
  }
  template <typename In>
  FR_HOST_DEVICE A fold(A acc, In x, int64_t) const {
    const A magnitude = std::abs(widen_to<A>(x));
    switch (kOrder) {
      case NormOrder::Zero: return acc + A(magnitude != A(0));
      case NormOrder::One: return acc + magnitude;
      case NormOrder::Two: return acc + magnitude * magnitude;
      case NormOrder::Other: return acc + std::pow(magnitude, p);
      default: return combine(acc, magnitude);
    }
  }
  // The norm of a single element: |x| (x != 0 for order 0), with no power
  // and root to over- or underflow on the way (a float of 1e30, order 2).
  FR_HOST_DEVICE static A of_one(A magnitude) {
    return kOrder == NormOrder::Zero ? A(magnitude != A(0)) : magnitude;
  }
  FR_HOST_DEVICE A finalize(A acc) const {
    if constexpr (kOrder == NormOrder::Two) return std::sqrt(acc);
    else if constexpr (kOrder == NormOrder::Other) return std::pow(acc, inv_p);
    else return acc;
  }
  static NormOp make(const ReduceParams& params, int64_t) {
    NormOp op;
    op.p = static_cast<A>(params.ord);
    op.inv_p = static_cast<A>(1.0 / params.ord);
    return op;
  }
};

inline NormOrder norm_order(double ord) {
  if (ord == 0) return NormOrder::Zero;
  if (ord == 1) return NormOrder::One;
  if (ord == 2) return NormOrder::Two;
  if (ord == std::numeric_limits<double>::infinity()) return NormOrder::Inf;
  if (ord == -std::numeric_limits<double>::infinity()) return NormOrder::NegInf;
  return NormOrder::Other;
}

// Accumulators: float for float and half types, double for double; sums of
// squares and powers of half types in double, where float would overflow
// (a bfloat16 of 1e20 squared).
template <typename In, NormOrder kOrder>
using NormAcc = std::conditional_t<sizeof(In) == 8 || (sizeof(In) == 2 && (kOrder == NormOrder::Two ||
                                                                           kOrder == NormOrder::Other)),
                                   double, float>;

// Calls f(op, TypeTag<In>{}, TypeTag<Sink>{}) for var (var/std/var_mean/std_mean),
// logsumexp or norm over a floating `dtype`; other kinds and dtypes give `refused`.
// kDoubleMoments: var of float types in double, as torch's CPU kernels (a
// float32 of 1e20 squared overflows float); torch's CUDA ones stay in float.
template <typename Half, typename BFloat16, bool kDoubleMoments, typename R, typename F>
R visit_statistic(ReduceKind kind, DType dtype, const ReduceParams& params, int64_t len, R refused, F&& f) {
  return visit_dtype<Half, BFloat16>(dtype, [&](auto tag) -> R {
    using In = typename decltype(tag)::type;
    if constexpr (std::numeric_limits<In>::is_integer) {
      return refused;
    } else {
      using A = std::conditional_t<sizeof(In) == 8, double, float>;
      switch (kind) {
        case ReduceKind::Var:
          if (params.acc_outputs) return f(VarOp<A>::make(params, len), tag, TypeTag<PairSink<A>>{});
          return f(VarOp<std::conditional_t<kDoubleMoments, double, A>>::make(params, len), tag,
                   TypeTag<PairSink<In>>{});
        case ReduceKind::LogSumExp: return f(LogSumExpOp<A>::make(params, len), tag, TypeTag<In*>{});
        case ReduceKind::Norm: {
          auto norm = [&](auto order) {
            constexpr NormOrder kOrder = decltype(order)::value;
            return f(NormOp<NormAcc<In, kOrder>, kOrder>::make(params, len), tag, TypeTag<In*>{});
          };
          using std::integral_constant;
          switch (norm_order(params.ord)) {
            case NormOrder::Zero: return norm(integral_constant<NormOrder, NormOrder::Zero>{});
            case NormOrder::One: return norm(integral_constant<NormOrder, NormOrder::One>{});
            case NormOrder::Two: return norm(integral_constant<NormOrder, NormOrder::Two>{});
            case NormOrder::Inf: return norm(integral_constant<NormOrder, NormOrder::Inf>{});
            case NormOrder::NegInf: return norm(integral_constant<NormOrder, NormOrder::NegInf>{});
            default: return norm(integral_constant<NormOrder, NormOrder::Other>{});
          }
        }
        default: return refused;
      }
    }
  });
}

}  // namespace fastreduce
