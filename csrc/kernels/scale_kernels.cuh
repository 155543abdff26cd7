// data *= factor, with the factor read on the device: a loss's gradient
// computed in the forward is scaled in the backward by the incoming gradient
// without a host synchronisation, and not touched at all when that gradient
// is 1 (the usual loss.backward()): every block returns at once.
#pragma once

#include "row_io.cuh"

namespace fastreduce {

// F: the factor's type, the data's own (a loss's incoming gradient) or its
// accumulator type.
template <typename T, typename F, int kVec>
__global__ void scale_unless_one_kernel(T* data, int64_t n, const F* __restrict__ factor) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const A f = static_cast<A>(*factor);
  if (f == A(1)) return;
  const int64_t packs = n / kVec, stride = int64_t(gridDim.x) * blockDim.x;
  auto* p = reinterpret_cast<Pack*>(data);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += stride) {
    Pack v = p[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) v.elem[k] = static_cast<T>(static_cast<A>(v.elem[k]) * f);
    p[i] = v;
  }
  // The tail past the last whole pack.
  for (int64_t i = packs * kVec + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    data[i] = static_cast<T>(static_cast<A>(data[i]) * f);
}

}  // namespace fastreduce
