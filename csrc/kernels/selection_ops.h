// The ops of argmax/argmin (value and index), aminmax (both extremes) and
// any/all, on the contract of reduce_op.h. Torch-free and CUDA-free.
#pragma once

#include <cstring>

#include "reduce_op.h"

namespace fastreduce {

template <typename V>
struct ValueIndex {
  V value;
  int64_t index;
};

// torch's argmax/argmin: a NaN wins over every number, and among equal
// values (or NaNs) the first index wins, so any combine order gives it.
template <typename V, bool kMax>
struct ArgExtremumOp {
  using acc_t = ValueIndex<V>;
  using Extreme = std::conditional_t<kMax, MaxOp<V>, MinOp<V>>;  // the extreme value alone, NaN-propagating
  FR_HOST_DEVICE static acc_t identity() {
    return {kMax ? MaxOp<V>::identity() : MinOp<V>::identity(), std::numeric_limits<int64_t>::max()};
  }
  FR_HOST_DEVICE static acc_t combine(acc_t a, acc_t b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan || b_nan) {
      if (a_nan != b_nan) return a_nan ? a : b;
    } else if (a.value != b.value) {
      return (kMax ? a.value > b.value : a.value < b.value) ? a : b;
    }
    return a.index <= b.index ? a : b;
  }
  template <typename In>
  FR_HOST_DEVICE acc_t fold(acc_t acc, In x, int64_t index) const {
    return combine(acc, {widen_to<V>(x), index});
  }
  // A run of consecutive indices: its extreme value first (NaN-propagating,
  // one instruction an element on the GPU), then, only where that value
  // beats or ties acc (rare past a thread's first runs), the first index
  // holding it. fold takes a compare and selects of a value and a 64-bit
  // index an element. (join_extreme does the same for a block in memory; a
  // GPU run that called it, searching the run again, lost the gain: argmax
  // bfloat16 (8192, 8192) dim 1 49.9 -> 56.2 µs on the H200.)
  template <typename In, int N>
  FR_HOST_DEVICE acc_t fold_run(acc_t acc, const In (&run)[N], int64_t index) const {
    V raw[N];
    for (int k = 0; k < N; ++k) raw[k] = widen_to<V>(run[k]);
    V best = raw[0];
    for (int k = 1; k < N; ++k) best = Extreme::combine(best, raw[k]);
    const bool best_nan = best != best;
    if (!best_nan && (acc.value != acc.value || (kMax ? best < acc.value : best > acc.value))) return acc;
    int first = 0;
    while (first < N - 1 && !(best_nan ? raw[first] != raw[first] : raw[first] == best)) ++first;
    return combine(acc, {best, index + first});
  }
  // x after every index in acc, which holds an element (not the identity):
  // only a better value, or a first NaN, takes its place.
  template <typename In>
  FR_HOST_DEVICE acc_t fold_later(acc_t acc, In x, int64_t index) const {
    const V value = widen_to<V>(x);
    const bool better = !(kMax ? value <= acc.value : value >= acc.value) && acc.value == acc.value;
    return better ? acc_t{value, index} : acc;
  }
  // acc joined with `top`, the extreme of x[0, n) (indices from `index`):
  // only where top beats or ties acc (rare past the first blocks) is x
  // searched for the first index holding it. The CPU's blocks take it.
  template <typename In>
  static acc_t join_extreme(acc_t acc, V top, const In* x, int64_t n, int64_t index) {
    const bool top_nan = top != top;
    if (!top_nan && (acc.value != acc.value || (kMax ? top < acc.value : top > acc.value))) return acc;
    int64_t first = 0;
    for (; first < n - 1; ++first) {
      const V value = widen_to<V>(x[first]);
      if (top_nan ? value != value : value == top) break;
    }
    return combine(acc, {top, index + first});
  }
  FR_HOST_DEVICE void store(int64_t* out, int64_t i, acc_t acc) const { out[i] = acc.index; }
  static ArgExtremumOp make(const ReduceParams&, int64_t) { return {}; }
};

template <typename V>
struct MinAndMax {
  V min, max;
};

// aminmax: amin and amax in one read, NaN propagating into both.
template <typename V>
struct MinMaxOp {
  using acc_t = MinAndMax<V>;
  FR_HOST_DEVICE static acc_t identity() { return {MinOp<V>::identity(), MaxOp<V>::identity()}; }
  FR_HOST_DEVICE static acc_t combine(acc_t a, acc_t b) {
    return {MinOp<V>::combine(a.min, b.min), MaxOp<V>::combine(a.max, b.max)};
  }
  template <typename In>
  FR_HOST_DEVICE acc_t fold(acc_t acc, In x, int64_t) const {
    const V value = widen_to<V>(x);
    return combine(acc, {value, value});
  }
  template <typename Out>
  FR_HOST_DEVICE void store(PairSink<Out> out, int64_t i, acc_t acc) const {
    out.first[i] = static_cast<Out>(acc.min);
    out.second[i] = static_cast<Out>(acc.max);
  }
  static MinMaxOp make(const ReduceParams&, int64_t) { return {}; }
};

// any/all: whether some (every) element is non-zero; NaN counts as non-zero.
template <bool kAll>
struct LogicalOp : ElementwiseOp<LogicalOp<kAll>, int> {
  FR_HOST_DEVICE static int identity() { return kAll ? 1 : 0; }
  FR_HOST_DEVICE static int combine(int a, int b) { return kAll ? a & b : a | b; }
  template <typename In>
  FR_HOST_DEVICE int fold(int acc, In x, int64_t) const {
    using W = std::conditional_t<std::is_arithmetic_v<In>, In, float>;
    return combine(acc, widen_to<W>(x) != W(0));
  }
  // Bytes (bool, int8, uint8) a 64-bit word at a time: a word holds a zero
  // byte exactly when (word - 0x01..01) & ~word & 0x80..80 is non-zero.
  template <typename In, int N>
  FR_HOST_DEVICE std::enable_if_t<sizeof(In) == 1 && N % 8 == 0, int> fold_pack(int acc, const In (&pack)[N],
                                                                                 int64_t) const {
    constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
    for (int k = 0; k < N; k += 8) {
      uint64_t word;
      std::memcpy(&word, &pack[k], sizeof(word));
      acc = combine(acc, kAll ? ((word - kOnes) & ~word & kHighs) == 0 : word != 0);
    }
    return acc;
  }
};

// The comparison type of a selection: half types compare as float, narrow
// integers as int (the warp shuffle's smallest), the rest as they are.
template <typename In>
using SelectValue = std::conditional_t<!std::is_arithmetic_v<In>, float,
                                       std::conditional_t<(sizeof(In) < 4), int, In>>;

// Calls f(op, TypeTag<In>{}, TypeTag<Sink>{}) for argmax/argmin (not bool),
// aminmax or any/all (output bool, or uint8 for a uint8 input as torch);
// other kinds give `refused`.
template <typename Half, typename BFloat16, typename R, typename F>
R visit_selection(ReduceKind kind, DType dtype, R refused, F&& f) {
  return visit_dtype<Half, BFloat16>(dtype, [&](auto tag) -> R {
    using In = typename decltype(tag)::type;
    using V = SelectValue<In>;
    using Logical = std::conditional_t<std::is_same_v<In, uint8_t>, uint8_t, bool>;
    switch (kind) {
      case ReduceKind::ArgMax:
      case ReduceKind::ArgMin:
        if constexpr (std::is_same_v<In, bool>) {
          return refused;
        } else {
          if (kind == ReduceKind::ArgMax) return f(ArgExtremumOp<V, true>{}, tag, TypeTag<int64_t*>{});
          return f(ArgExtremumOp<V, false>{}, tag, TypeTag<int64_t*>{});
        }
      case ReduceKind::MinMax: return f(MinMaxOp<V>{}, tag, TypeTag<PairSink<In>>{});
      case ReduceKind::Any: return f(LogicalOp<false>{}, tag, TypeTag<Logical*>{});
      case ReduceKind::All: return f(LogicalOp<true>{}, tag, TypeTag<Logical*>{});
      default: return refused;
    }
  });
}

}  // namespace fastreduce
