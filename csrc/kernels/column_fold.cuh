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

// out[c] = sum of partials[r * n + c] over r < count, for groups of kVec
// columns: block b folds groups b, b + gridDim.x, ...; thread t adds rows t,
// t + blockDim.x, ... in order and the block combines its threads as
// block_allreduce does: bitwise reproducible for a given launch shape.
template <typename T, int kVec, typename A>
__device__ void fold_column_groups(const A* partials, int count, int64_t n, ParamGrad out) {
  using Pack = VecN<A, kVec>;
  __shared__ Pack scratch[kWarpSize];
  for (int64_t group = blockIdx.x; group < n / kVec; group += gridDim.x) {
    Pack sum{};
    for (int r = threadIdx.x; r < count; r += blockDim.x)
      sum = PackSum<A, kVec>::combine(sum, reinterpret_cast<const Pack*>(partials + r * n)[group]);
    sum = block_allreduce<PackSum<A, kVec>>(sum, scratch);
    if (threadIdx.x == 0) store_group<T>(out, group, sum);
  }
}

// 16-byte groups where n allows (each partial row then starts 16-byte
// aligned; the buffer does).
template <typename A>
constexpr int fold_group(int64_t n) {
  return n % (16 / sizeof(A)) == 0 ? 16 / sizeof(A) : 1;
}

constexpr int kFoldThreads = 256;

// Launched as a programmatic dependent of the kernel that stores the
// partial rows (`count` of n each; partial_b null without a bias).
template <typename T, int kVec, typename A>
__global__ void __launch_bounds__(kFoldThreads)
    fold_param_grads_kernel(const A* partial_w, const A* partial_b, int count, int64_t n, ParamGrad dweight,
                            ParamGrad dbias) {
  wait_for_producer();
  fold_column_groups<T, kVec>(partial_w, count, n, dweight);
  if (partial_b) fold_column_groups<T, kVec>(partial_b, count, n, dbias);
}

}  // namespace fastreduce
