// CPU vector helpers shared by the CPU reductions and normalisations: the
// accumulator type of an input type, element-wise ops on at::vec::Vectorized
// that mirror the scalar reduction ops, and a scratch buffer that widens
// float16/bfloat16 data to float so the math runs on float vectors.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <array>
#include <vector>

#include "../kernels/reduce_op.h"

namespace fastreduce::cpu {

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

// Folds n contiguous accumulator values: four vectors side by side (they
// hide the add latency), then the vectors in a fixed order, then the tail.
template <typename Op, typename Acc>
Acc fold_vectors(const Acc* x, int64_t n) {
  using V = Vec<Acc>;
  constexpr int kLanes = 4;
  constexpr int64_t step = kLanes * V::size();
  std::array<V, kLanes> lanes;
  lanes.fill(V(Op::identity()));
  int64_t i = 0;
  for (; i + step <= n; i += step)
    for (int l = 0; l < kLanes; ++l) lanes[l] = VecOp<Op>::combine(lanes[l], V::loadu(x + i + l * V::size()));
  for (; i + V::size() <= n; i += V::size()) lanes[0] = VecOp<Op>::combine(lanes[0], V::loadu(x + i));
  V folded = lanes[0];
  for (int l = 1; l < kLanes; ++l) folded = VecOp<Op>::combine(folded, lanes[l]);
  std::array<Acc, V::size()> parts;
  folded.store(parts.data());
  return combine_all<Op>(x + i, n - i, combine_all<Op>(parts.data(), V::size()));
}

template <typename A>
A sum(const A* x, int64_t n) {
  return fold_vectors<SumOp<A>>(x, n);
}

// n values of a half type converted to float (or back), 16 at a time.
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
  } else if constexpr (std::is_same_v<From, float> && !std::is_same_v<To, float>) {
    for (; i + step <= n; i += step)
      at::vec::convert_from_float<To>(Vec<float>::loadu(in + i), Vec<float>::loadu(in + i + Vec<float>::size()))
          .store(out + i);
  }
  at::vec::convert(in + i, out + i, n - i);
}

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

// Writes n accumulator values as T.
template <typename T, typename A>
void narrow(const A* values, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    if (values != out) std::copy(values, values + n, out);
  } else {
    convert(values, out, n);
  }
}

}  // namespace fastreduce::cpu
