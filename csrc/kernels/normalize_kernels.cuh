// The apply half of a norm whose row statistics were reduced elsewhere (the
// ranks of a tensor-parallel group, each holding a slice of every row,
// exchange only those): y = (x - mean[row]) * rstd[row] * weight + bias,
// element-wise over contiguous (rows, n) data, a pack of kVec elements per
// thread step. One read and one write: the statistics pass is a reduction.
#pragma once

#include "block_reduce.cuh"
#include "dtype.h"
#include "norm_buffers.h"

namespace fastreduce {

// The buffers (norm_buffers.h), typed, and the shape.
template <typename T>
struct NormalizeArgs : NormApplyBuffers<T, opmath_t<T>> {
  int64_t rows, n;
};

template <typename T, int kVec>
__global__ void normalize_rows_kernel(NormalizeArgs<T> a) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const int64_t packs_per_row = a.n / kVec, packs = a.rows * packs_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / packs_per_row, column_pack = i - row * packs_per_row;
    const Pack v = reinterpret_cast<const Pack*>(a.x)[i];
    Pack scale, shift;
    if (a.weight) scale = reinterpret_cast<const Pack*>(a.weight)[column_pack];
    if (a.bias) shift = reinterpret_cast<const Pack*>(a.bias)[column_pack];
    const A mean = a.mean ? a.mean[row] : A(0), rstd = a.rstd[row];
    Pack out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      A value = (static_cast<A>(v.elem[k]) - mean) * rstd;
      if (a.weight) value *= static_cast<A>(scale.elem[k]);
      if (a.bias) value += static_cast<A>(shift.elem[k]);
      out.elem[k] = static_cast<T>(value);
    }
    reinterpret_cast<Pack*>(a.y)[i] = out;
  }
}

}  // namespace fastreduce
