// CPU vector helpers shared by the CPU reductions and normalisations: the
// accumulator type of an input type, element-wise ops on at::vec::Vectorized
// that mirror the scalar reduction ops, a scratch buffer that widens
// float16/bfloat16 data to float so the math runs on float vectors, and the
// loops that widen and narrow them in registers instead.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <array>
#include <tuple>
#include <vector>

#include "../kernels/reduce_op.h"

namespace fastreduce::cpu {

// Calls f(TypeTag<T>{}) for the floating C++ type T of `dtype` (the glue has
// refused the others).
template <typename F>
void with_floating(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Half: return f(TypeTag<c10::Half>{});
    case DType::BFloat16: return f(TypeTag<c10::BFloat16>{});
    case DType::Float: return f(TypeTag<float>{});
    default: return f(TypeTag<double>{});
  }
}

template <typename T>
using Vec = at::vec::Vectorized<T>;

// The vector form of each scalar op (reduce_op.h); maximum/minimum propagate
// NaN like MaxOp/MinOp.
template <typename Op>
struct VecOp;
template <typename A>
struct VecOp<SumOp<A>> {
  static Vec<A> combine(const Vec<A>& a, const Vec<A>& b) { return a + b; }
};
template <typename A>
struct VecOp<MeanOp<A>> : VecOp<SumOp<A>> {};
template <typename A>
struct VecOp<ProdOp<A>> {
  static Vec<A> combine(const Vec<A>& a, const Vec<A>& b) { return a * b; }
};
template <typename A>
struct VecOp<MaxOp<A>> {
  static Vec<A> combine(const Vec<A>& a, const Vec<A>& b) { return at::vec::maximum(a, b); }
};
template <typename A>
struct VecOp<MinOp<A>> {
  static Vec<A> combine(const Vec<A>& a, const Vec<A>& b) { return at::vec::minimum(a, b); }
};

template <typename Op, typename Acc>
Acc combine_all(const Acc* values, int64_t n, Acc acc = Op::identity()) {
  for (int64_t i = 0; i < n; ++i) acc = Op::combine(acc, values[i]);
  return acc;
}

// Four accumulator vectors of values from x: loaded as they are, or
// float16/bfloat16 widened on the way (two 16-element loads).
template <typename In, typename A>
void load_four(const In* x, std::array<Vec<A>, 4>& v) {
  if constexpr (std::is_same_v<In, A>) {
    for (int l = 0; l < 4; ++l) v[l] = Vec<A>::loadu(x + l * Vec<A>::size());
  } else {
    constexpr int64_t half = 2 * Vec<A>::size();
    std::tie(v[0], v[1]) = at::vec::convert_to_float<In>(Vec<In>::loadu(x));
    std::tie(v[2], v[3]) = at::vec::convert_to_float<In>(Vec<In>::loadu(x + half));
  }
}

// fold_vectors' default map: each value as it is.
struct Unchanged {
  template <typename T>
  T operator()(const T& value) const { return value; }
};

// Folds n contiguous values, each through `map` (on vectors and scalars
// alike), into the op's accumulator type: four vectors side by side (they
// hide the add latency), then the vectors in a fixed order, then the tail
// one element at a time.
template <typename Op, typename In, typename Acc = typename Op::acc_t, typename Map = Unchanged>
Acc fold_vectors(const In* x, int64_t n, Map map = {}) {
  using V = Vec<Acc>;
  constexpr int64_t step = 4 * V::size();
  std::array<V, 4> lanes, loaded;
  lanes.fill(V(Op::identity()));
  int64_t i = 0;
  for (; i + step <= n; i += step) {
    load_four<In, Acc>(x + i, loaded);
    for (int l = 0; l < 4; ++l) lanes[l] = VecOp<Op>::combine(lanes[l], map(loaded[l]));
  }
  const V folded = VecOp<Op>::combine(VecOp<Op>::combine(lanes[0], lanes[1]), VecOp<Op>::combine(lanes[2], lanes[3]));
  std::array<Acc, V::size()> parts;
  folded.store(parts.data());
  Acc acc = combine_all<Op>(parts.data(), V::size());
  for (; i < n; ++i) acc = Op::combine(acc, map(static_cast<Acc>(x[i])));
  return acc;
}

// The sum of map(x[i]). Long rows fold in blocks whose results add in
// double, so the rounding error is that of one block, not one that grows
// with the row (a float layer_norm over 2^20 values lost 1e-5 of its rstd).
// Blocks of 512 hold 16 values a float lane (AVX2): one value far out
// (LLMs' massive activations) rounds at most the 15 squares after it in its
// lane at its own scale (in blocks of 4096, a value 10^4 deviations out
// gave 4-6x torch's layer_norm error at 262144 wide).
template <typename A, typename Map = Unchanged>
A sum(const A* x, int64_t n, Map map = {}) {
  constexpr int64_t kBlock = 512;
  if (n <= kBlock) return fold_vectors<SumOp<A>>(x, n, map);
  double total = 0;
  for (int64_t i = 0; i < n; i += kBlock) total += fold_vectors<SumOp<A>>(x + i, std::min(kBlock, n - i), map);
  return static_cast<A>(total);
}

// n values of a half type converted to float, 16 at a time (or of any
// type to any other, one at a time).
template <typename From, typename To>
void convert(const From* in, To* out, int64_t n) {
  constexpr int64_t step = Vec<float>::size() * 2;
  int64_t i = 0;
  if constexpr (std::is_same_v<To, float> && !std::is_same_v<From, float>) {
    for (; i + step <= n; i += step) {
      auto [low, high] = at::vec::convert_to_float<From>(Vec<From>::loadu(in + i));
      low.store(out + i);
      high.store(out + i + Vec<float>::size());
    }
  }
  at::vec::convert(in + i, out + i, n - i);
}

// f(i, count) over whole vectors, then once for the tail with count < size:
// loadu/store with a count, lanes past it zero, so f is written once.
template <typename A, typename F>
void for_each_vector(int64_t n, F&& f) {
  using V = Vec<A>;
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) f(i, V::size());
  if (i < n) f(i, n - i);
}

// f(i, count, v) for each accumulator vector v of x[0, n) (count < size only
// at the tail, lanes past it zero): half types widened in registers, two
// vectors from one load.
template <typename T, typename F>
void for_each_widened(const T* x, int64_t n, F&& f) {
  using A = at::opmath_type<T>;
  using V = Vec<A>;
  if constexpr (std::is_same_v<T, A>) {
    for_each_vector<A>(n, [&](int64_t i, int64_t count) { f(i, count, V::loadu(x + i, count)); });
  } else {
    constexpr int64_t kStep = 2 * V::size();
    for (int64_t i = 0; i < n; i += kStep) {
      const int64_t count = std::min(kStep, n - i);
      const auto [low, high] = at::vec::convert_to_float<T>(Vec<T>::loadu(x + i, count));
      f(i, std::min<int64_t>(count, V::size()), low);
      if (count > V::size()) f(i + V::size(), count - V::size(), high);
    }
  }
}

// Rows of n elements per parallel task: about 4K elements, so a (64, 256)
// input already runs on every thread (at 32K it ran on one: softmax took
// 1.35x aten's time). Rows are independent: results do not depend on it.
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)); }

// Data of type T seen as its accumulator type A: float and double in place,
// float16/bfloat16 widened into a buffer the caller keeps (one per thread).
template <typename T, typename A = at::opmath_type<T>>
const A* widen(const T* data, int64_t n, std::vector<A>& buffer) {
  if constexpr (std::is_same_v<T, A>) {
    return data;
  } else {
    buffer.resize(n);
    convert(data, buffer.data(), n);
    return buffer.data();
  }
}

// out[i, i + count) = map(i, count, values[i, i + count)) for the vectors of
// n values, as T: half types narrowed in registers.
template <typename T, typename A, typename Map>
void store_narrowed(const A* values, int64_t n, T* out, Map&& map) {
  using V = Vec<A>;
  if constexpr (std::is_same_v<T, A>) {
    for_each_vector<A>(n, [&](int64_t i, int64_t count) {
      map(i, count, V::loadu(values + i, count)).store(out + i, count);
    });
  } else {
    constexpr int64_t kStep = 2 * V::size();
    for (int64_t i = 0; i < n; i += kStep) {
      const int64_t count = std::min(kStep, n - i);
      const int64_t low_count = std::min<int64_t>(count, V::size()), high_count = count - low_count;
      const V low = map(i, low_count, V::loadu(values + i, low_count));
      const V high = high_count > 0 ? map(i + V::size(), high_count, V::loadu(values + i + V::size(), high_count)) : V(0);
      at::vec::convert_from_float<T>(low, high).store(out + i, count);
    }
  }
}

// Writes n accumulator values as T.
template <typename T, typename A>
void narrow(const A* values, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    if (values != out) std::copy(values, values + n, out);
  } else {
    store_narrowed(values, n, out, [](int64_t, int64_t, const Vec<A>& v) { return v; });
  }
}

}  // namespace fastreduce::cpu
