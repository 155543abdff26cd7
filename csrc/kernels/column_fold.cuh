// The second stage of the norm backwards' weight and bias gradients: column
// sums of the partial rows the first stage stored, both parameters in one
// launch that starts while the first stage drains, written in each
// parameter's own type.
#pragma once

#include "block_reduce.cuh"
#include "dependent_launch.cuh"

namespace fastreduce {

// A parameter's gradient, n elements: in the input type T where the
// parameter is (half parameters beside half inputs), else in the
// accumulator type.
struct ParamGrad {
  void* data;
  bool in_input_type;
};

template <typename T, int kVec, typename A>
__device__ void store_group(ParamGrad out, int64_t group, const VecN<A, kVec>& sum) {
  if (!out.in_input_type) {
    static_cast<VecN<A, kVec>*>(out.data)[group] = sum;
    return;
  }
  VecN<T, kVec> narrowed;
#pragma unroll
  for (int j = 0; j < kVec; ++j) narrowed.elem[j] = static_cast<T>(sum.elem[j]);
  static_cast<VecN<T, kVec>*>(out.data)[group] = narrowed;
}

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

// A block folds kFoldColumns groups of columns (64 contiguous bytes of each
// partial row for float packs: a warp's load takes 8 rows of them whole)
// over kFoldRowLanes lanes of rows. One thread a column group walking every
// row would wait on load after load; one thread a row would make each warp
// load touch 32 rows for 16 bytes each.
constexpr int kFoldThreads = 256, kFoldColumns = 4, kFoldRowLanes = kFoldThreads / kFoldColumns;

// Launched as a programmatic dependent of the kernel that stores the
// partial rows (`count` of n each; partial_b null without a bias):
// blockIdx.y 0 folds partial_w into dweight, 1 partial_b into dbias. Thread
// (lane, c) adds rows lane, lane + kFoldRowLanes, ... of column group c in
// order, then warp 0 adds the lanes in a fixed tree: bitwise reproducible.
template <typename T, int kVec, typename A>
__global__ void __launch_bounds__(kFoldThreads)
    fold_param_grads_kernel(const A* partial_w, const A* partial_b, int count, int64_t n, ParamGrad dweight,
                            ParamGrad dbias) {
  using Pack = VecN<A, kVec>;
  using Sum = PackSum<A, kVec>;
  __shared__ Pack lanes[kFoldRowLanes][kFoldColumns];
  const A* const partials = blockIdx.y == 0 ? partial_w : partial_b;
  const int c = threadIdx.x % kFoldColumns, lane = threadIdx.x / kFoldColumns;
  const int64_t group = blockIdx.x * int64_t(kFoldColumns) + c;
  const bool inside = group < n / kVec;
  wait_for_producer();
  Pack sum{};
  if (inside)
#pragma unroll 8
    for (int r = lane; r < count; r += kFoldRowLanes)
      sum = Sum::combine(sum, reinterpret_cast<const Pack*>(partials + r * n)[group]);
  lanes[lane][c] = sum;
  __syncthreads();
  if (threadIdx.x >= kWarpSize) return;
  // Warp 0 (lanes 0-7): lane k of column c adds lanes k + 8, k + 16, ...
  // to its own, then the 8 are added across the warp.
  constexpr int kStride = kWarpSize / kFoldColumns;
  for (int l = lane + kStride; l < kFoldRowLanes; l += kStride) sum = Sum::combine(sum, lanes[l][c]);
#pragma unroll
  for (int offset = kWarpSize / 2; offset >= kFoldColumns; offset /= 2)
    sum = Sum::combine(sum, shuffle_xor(sum, offset));
  if (lane == 0 && inside) store_group<T>(blockIdx.y == 0 ? dweight : dbias, group, sum);
}

}  // namespace fastreduce
