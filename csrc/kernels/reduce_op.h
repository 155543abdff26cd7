// The reduction-op abstraction shared by every kernel, CUDA and CPU alike:
// an op is an identity, a combine and a finalize over its accumulator type.
// This header has no torch and no CUDA dependency so the CPU path can use it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "dtype.h"

#if defined(__CUDACC__)
#define FR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FR_HOST_DEVICE inline
#endif

namespace fastreduce {

enum class ReduceKind { Sum, Mean, Prod, Max, Min, Var, LogSumExp, Norm, ArgMax, ArgMin, MinMax, Any, All };

// What the ops of a kind take beyond their input: the Bessel-style
// correction and root of var/std, the order of a vector norm.
struct ReduceParams {
  double correction = 0;
  bool root = false;  // std instead of var
  bool acc_outputs = false;  // var: mean and variance in the accumulator type (_row_moments)
  double ord = 2;
};

// x as the accumulator type A: half types through float (their one
// conversion), the rest directly.
template <typename A, typename In>
FR_HOST_DEVICE A widen_to(In x) {
  if constexpr (std::is_arithmetic_v<In>) return static_cast<A>(x);
  else return static_cast<A>(static_cast<float>(x));
}

// An op's contract, for the kernels of every device:
//   acc_t; static identity() and combine(a, b), associative and, in the
//   fixed order the kernels use, deterministic;
//   fold(acc, element, index): one input element joins an accumulator;
//   store(sink, i, acc): the finished accumulator of output element i;
//   make(params, len): the op for a reduction over len elements.
//   optionally fold_pack(acc, const In (&pack)[N], index): N elements at
//   once, paying a per-step cost (a division, a rescale) once per pack;
//   such ops ignore indices, so a pack's elements need not be adjacent.
//   optionally fold_tree(acc, const In (&round)[N], index): N elements
//   added pairwise, then to acc (sums of float32: no chain of N dependent
//   adds);
//   optionally fold_run(acc, const In (&run)[N], index): N elements of
//   consecutive indices from `index` at once (argmax: the run's extreme
//   first, an index only where it can win). The GPU kernels take it; the
//   CPU's argmax works a 4096-element block at a time instead (a run of 16
//   there ran 3x slower than the element fold).
//   optionally fold_later(acc, element, index): fold where acc holds an
//   element already and index follows all of acc's (a column walked down
//   its rows): no tie of indices to break.
// Most ops fold an element by combining it as an accumulator and store one
// value; ElementwiseOp gives them that.
// Whether Call<Op, In, N>, the type of a call, is well formed.
template <template <typename, typename, int> class Call, typename Op, typename In, int N, typename = void>
struct Detected : std::false_type {};
template <template <typename, typename, int> class Call, typename Op, typename In, int N>
struct Detected<Call, Op, In, N, std::void_t<Call<Op, In, N>>> : std::true_type {};
template <typename Op, typename In, int N>
using FoldPackCall = decltype(std::declval<const Op&>().fold_pack(std::declval<typename Op::acc_t>(),
                                                                  std::declval<const In (&)[N]>(), int64_t()));
template <typename Op, typename In, int N>
using FoldTreeCall = decltype(std::declval<const Op&>().fold_tree(std::declval<typename Op::acc_t>(),
                                                                  std::declval<const In (&)[N]>(), int64_t()));
template <typename Op, typename In, int N>
using FoldRunCall = decltype(std::declval<const Op&>().fold_run(std::declval<typename Op::acc_t>(),
                                                                std::declval<const In (&)[N]>(), int64_t()));
template <typename Op, typename In, int>
using FoldLaterCall = decltype(std::declval<const Op&>().fold_later(std::declval<typename Op::acc_t>(),
                                                                    std::declval<In>(), int64_t()));
// Whether Op has fold_pack (fold_tree, fold_run) for N elements of In, and
// fold_later for one.
template <typename Op, typename In, int N>
using FoldsPacks = Detected<FoldPackCall, Op, In, N>;
template <typename Op, typename In, int N>
using FoldsTrees = Detected<FoldTreeCall, Op, In, N>;
template <typename Op, typename In, int N>
using FoldsRuns = Detected<FoldRunCall, Op, In, N>;
template <typename Op, typename In>
using FoldsLater = Detected<FoldLaterCall, Op, In, 1>;

template <typename Op, typename Acc>
struct ElementwiseOp {
  using acc_t = Acc;
  template <typename In>
  FR_HOST_DEVICE Acc fold(Acc acc, In x, int64_t /*index*/) const {
    return Op::combine(acc, static_cast<Acc>(x));
  }
  FR_HOST_DEVICE Acc finalize(Acc acc) const { return acc; }
  template <typename Out>
  FR_HOST_DEVICE void store(Out* out, int64_t i, Acc acc) const {
    out[i] = static_cast<Out>(static_cast<const Op*>(this)->finalize(acc));
  }
  static Op make(const ReduceParams&, int64_t /*len*/) { return Op{}; }
};

// A second pass folds accumulator partials: combining, then the op's store.
template <typename Op>
struct CombinePartials {
  using acc_t = typename Op::acc_t;
  Op op;
  FR_HOST_DEVICE static acc_t identity() { return Op::identity(); }
  FR_HOST_DEVICE static acc_t combine(acc_t a, acc_t b) { return Op::combine(a, b); }
  FR_HOST_DEVICE acc_t fold(acc_t acc, acc_t partial, int64_t) const { return Op::combine(acc, partial); }
  template <typename Sink>
  FR_HOST_DEVICE void store(Sink out, int64_t i, acc_t acc) const { op.store(out, i, acc); }
};

// Two outputs written side by side (var_mean, aminmax); `second` may be null.
template <typename A, typename B = A>
struct PairSink {
  A* first;
  B* second;
};

// Sums of float32 add a round of a thread's loads (16 elements) as a tree
// before joining the accumulator: one add an element as before, but not 16
// in a dependent chain, which short rows' teams (512-thread blocks, three an
// SM) could not hide. H200, µs, float32 sum dim 1, 256 MiB
// (bench/micro/row_sums.cu): rows of 128 69.1 -> 64.5, 256 68.9 -> 63.7, 512
// 68.7 -> 62.3, 768 68.6 -> 66.7, 1024 65.9 -> 62.6; rows of one block,
// split rows and full sums tie; two-byte inputs gained nothing and keep the
// chain (teams of 4 lanes too: reduce_rows).
template <typename Acc>
struct AddsInTree {
  template <typename In, int N>
  FR_HOST_DEVICE std::enable_if_t<std::is_same_v<In, float>, Acc> fold_tree(Acc acc, const In (&round)[N],
                                                                            int64_t) const {
    static_assert((N & (N - 1)) == 0, "rounds of a power of two");
    Acc part[N];
    for (int k = 0; k < N; ++k) part[k] = static_cast<Acc>(round[k]);
    for (int width = N / 2; width > 0; width /= 2)
      for (int k = 0; k < width; ++k) part[k] += part[k + width];
    return acc + part[0];
  }
};

template <typename Acc>
struct SumOp : ElementwiseOp<SumOp<Acc>, Acc>, AddsInTree<Acc> {
  FR_HOST_DEVICE static Acc identity() { return Acc(0); }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a + b; }
};

// Like torch's MeanOps: a sum, multiplied by 1/count at the end.
template <typename Acc>
struct MeanOp : ElementwiseOp<MeanOp<Acc>, Acc>, AddsInTree<Acc> {
  Acc inv_count;
  FR_HOST_DEVICE static Acc identity() { return Acc(0); }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a + b; }
  FR_HOST_DEVICE Acc finalize(Acc a) const { return a * inv_count; }
  static MeanOp make(const ReduceParams&, int64_t len) {
    MeanOp op;
    op.inv_count = static_cast<Acc>(1.0 / static_cast<double>(len));
    return op;
  }
};

template <typename Acc>
struct ProdOp : ElementwiseOp<ProdOp<Acc>, Acc> {
  FR_HOST_DEVICE static Acc identity() { return Acc(1); }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a * b; }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// max.NaN / min.NaN (sm_80+): the NaN-propagating extreme of two floats in
// one instruction, where the portable form below takes two compares and two
// selects (enough to make aminmax slower than a sum of the same tensor).
template <bool kMax>
__device__ __forceinline__ float extreme_with_nan(float a, float b) {
  float r;
  if constexpr (kMax) asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif

// amax/amin propagate NaN like torch: once a NaN is seen it wins. For
// integer types `a != a` is false and the checks fold away.
template <typename Acc>
struct MaxOp : ElementwiseOp<MaxOp<Acc>, Acc> {
  FR_HOST_DEVICE static Acc identity() {
    return std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::lowest();
  }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<Acc, float>) return extreme_with_nan<true>(a, b);
#endif
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
};

template <typename Acc>
struct MinOp : ElementwiseOp<MinOp<Acc>, Acc> {
  FR_HOST_DEVICE static Acc identity() {
    return std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::max();
  }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<Acc, float>) return extreme_with_nan<false>(a, b);
#endif
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? a : b;
  }
};

// Accumulator types: half types widen to float; sums and products of
// integers widen to int64 (torch's output type); max/min of narrow integers
// use int32, which the warp shuffle supports.
template <typename In, ReduceKind K>
struct AccType {
  static constexpr bool is_float = !std::numeric_limits<In>::is_integer;
  static constexpr bool wide_int = K == ReduceKind::Sum || K == ReduceKind::Prod;
  using type = typename std::conditional<
      is_float, typename std::conditional<sizeof(In) == 8, double, float>::type,
      typename std::conditional<wide_int || sizeof(In) == 8, int64_t, int32_t>::type>::type;
};

// The types of one reduction: op, accumulator, output (torch's: int64 for
// sums and products of integers and bools, the input type otherwise).
template <ReduceKind K, typename In>
struct ReduceTypes {
  using acc_t = typename AccType<In, K>::type;
  using out_t = std::conditional_t<(K == ReduceKind::Sum || K == ReduceKind::Prod) &&
                                       std::numeric_limits<In>::is_integer,
                                   int64_t, In>;
  using op_t = std::conditional_t<
      K == ReduceKind::Sum, SumOp<acc_t>,
      std::conditional_t<K == ReduceKind::Mean, MeanOp<acc_t>,
                         std::conditional_t<K == ReduceKind::Prod, ProdOp<acc_t>,
                                            std::conditional_t<K == ReduceKind::Max, MaxOp<acc_t>,
                                                               MinOp<acc_t>>>>>;
};

// Calls f(std::integral_constant<ReduceKind, K>{}, TypeTag<In>{}) for a runtime
// (kind, dtype) of sum, mean, prod, max or min; mean of an integer type and
// the other kinds are refused with `refused`.
template <typename Half, typename BFloat16, typename R, typename F>
R visit_reduction(ReduceKind kind, DType dtype, R refused, F&& f) {
  return visit_dtype<Half, BFloat16>(dtype, [&](auto tag) -> R {
    using In = typename decltype(tag)::type;
    using std::integral_constant;
    switch (kind) {
      case ReduceKind::Sum: return f(integral_constant<ReduceKind, ReduceKind::Sum>{}, tag);
      case ReduceKind::Prod: return f(integral_constant<ReduceKind, ReduceKind::Prod>{}, tag);
      case ReduceKind::Max: return f(integral_constant<ReduceKind, ReduceKind::Max>{}, tag);
      case ReduceKind::Min: return f(integral_constant<ReduceKind, ReduceKind::Min>{}, tag);
      case ReduceKind::Mean:
        if constexpr (std::numeric_limits<In>::is_integer) return refused;
        else return f(integral_constant<ReduceKind, ReduceKind::Mean>{}, tag);
      default: return refused;
    }
  });
}

}  // namespace fastreduce
