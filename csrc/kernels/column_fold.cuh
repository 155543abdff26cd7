// Column sums of partial rows that every block of a cooperative launch has
// just stored (the norm backwards' weight and bias gradients): after a
// grid-wide barrier the whole grid folds them, so they cost no second launch.
#pragma once

#include "block_reduce.cuh"

namespace fastreduce {

template <typename A, int kVec>
struct PackSum {
  using Pack = VecN<A, kVec>;
  __device__ static Pack identity() { return Pack{}; }
  __device__ static Pack combine(Pack a, const Pack& b) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) a.elem[j] += b.elem[j];
    return a;
  }
};

// out[c] = sum of partials[r * n + c] over r < count, for groups of kVec
// columns: block b folds groups b, b + gridDim.x, ...; thread t adds rows t,
// t + blockDim.x, ... in order and the block combines its threads as
// block_allreduce does: bitwise reproducible for a given launch shape.
template <int kVec, typename A>
__device__ void fold_column_groups(const A* partials, int count, int64_t n, A* out) {
  using Pack = VecN<A, kVec>;
  static_assert(kVec == 1 || (sizeof(Pack) == 16 && alignof(Pack) == 16), "one load per group");
  __shared__ Pack scratch[kWarpSize];
  for (int64_t group = blockIdx.x; group < n / kVec; group += gridDim.x) {
    Pack sum{};
    for (int r = threadIdx.x; r < count; r += blockDim.x) {
      const Pack* row = reinterpret_cast<const Pack*>(partials + r * n);
      sum = PackSum<A, kVec>::combine(sum, load_from_other_block(row + group));
    }
    sum = block_allreduce<PackSum<A, kVec>>(sum, scratch);
    if (threadIdx.x == 0) reinterpret_cast<Pack*>(out)[group] = sum;
  }
}

// The column sums of `count` partial rows of n, 16-byte groups where n
// allows (each row then starts 16-byte aligned; `partials` does).
template <typename A>
__device__ void fold_columns(const A* partials, int count, int64_t n, A* out) {
  constexpr int kVec = 16 / sizeof(A);
  if (n % kVec == 0) fold_column_groups<kVec>(partials, count, n, out);
  else fold_column_groups<1>(partials, count, n, out);
}

}  // namespace fastreduce
