// The apply half of a norm whose row statistics were reduced elsewhere (the
// ranks of a tensor-parallel group, each holding a slice of every row,
// exchange only those): y = (x - mean[row]) * rstd[row] * weight + bias,
// element-wise over contiguous (rows, n) data, a pack of kVec elements per
// thread step. One read and one write: the statistics pass is a reduction.
#pragma once

#include "block_reduce.cuh"
#include "dtype.h"
#include "norm_buffers.h"
#include "row_io.cuh"

namespace fastreduce {

// The buffers (norm_buffers.h), typed, and the shape.
template <typename T, typename P = T>
struct NormalizeArgs : NormApplyBuffers<T, opmath_t<T>, P> {
  int64_t rows, n;
};

template <typename T, int kVec, typename P>
__global__ void normalize_rows_kernel(NormalizeArgs<T, P> a) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const int64_t packs_per_row = a.n / kVec, packs = a.rows * packs_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / packs_per_row, column_pack = i - row * packs_per_row;
    const Pack v = reinterpret_cast<const Pack*>(a.x)[i];
    VecN<P, kVec> scale, shift;
    if (a.weight) scale = load_param_pack<kVec>(a.weight + column_pack * kVec);
    if (a.bias) shift = load_param_pack<kVec>(a.bias + column_pack * kVec);
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
