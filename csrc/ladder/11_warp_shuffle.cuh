// Rung 11: warp shuffle (__shfl_down_sync).
// Against rung 10: the tree inside a warp moves through registers, not shared
// memory: five shuffles per warp, then one shared word per warp and a last
// shuffle round by the first warp. Shared memory shrinks from a word per
// thread to a word per warp, and all but two barriers disappear.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename A>
__device__ __forceinline__ A shuffle_down_sum(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;  // lane 0 holds the warp's sum
}

template <typename T, typename O>
__global__ void warp_shuffle_kernel(const T* x, int64_t n, O* out) {
  __shared__ Acc<T> warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Acc<T> v = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    v += load(x, i);
  v = shuffle_down_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? warp_sums[lane] : 0;
    v = shuffle_down_sum(v);
    if (lane == 0) out[blockIdx.x] = static_cast<O>(v);
  }
}

template <typename In>
cudaError_t warp_shuffle(const RungArgs& a) {
  return two_pass<In>(a, fill_grid(a, 512, 4), [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    warp_shuffle_kernel<<<blocks, 512, 0, a.stream>>>(in, n, out);
  });
}

}  // namespace fastreduce::ladder
