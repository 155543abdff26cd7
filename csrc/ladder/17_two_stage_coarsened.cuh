// Rung 17: two-stage warp reduction with thread coarsening.
// Against rung 16: each thread first folds 16 elements of its block's tile
// (16 independent, coalesced loads in flight), so a block covers 16 * 256
// elements; stage one reduces each warp with shuffles, stage two lets the
// first warp reduce the warp sums. Fewer, fatter blocks than rung 16, and
// the same recursion over partials.
#pragma once
#include "11_warp_shuffle.cuh"

namespace fastreduce::ladder {

template <typename T, typename O>
__global__ void __launch_bounds__(256) coarsened_kernel(const T* x, int64_t n, O* out) {
  using A = Acc<T>;
  constexpr int kCoarsen = 16;
  __shared__ A warp_sums[8];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t first = blockIdx.x * int64_t(kCoarsen * 256) + threadIdx.x;
  A loaded[kCoarsen];
#pragma unroll
  for (int k = 0; k < kCoarsen; ++k) loaded[k] = first + k * 256 < n ? load(x, first + k * 256) : A(0);
  A v = 0;
#pragma unroll
  for (int k = 0; k < kCoarsen; ++k) v += loaded[k];
  v = shuffle_down_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = shuffle_down_sum(lane < 8 ? warp_sums[lane] : A(0));
    if (lane == 0) out[blockIdx.x] = static_cast<O>(v);
  }
}

template <typename In>
cudaError_t two_stage_coarsened(const RungArgs& a) {
  return multipass<In>(a, 16 * 256, [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    coarsened_kernel<<<blocks, 256, 0, a.stream>>>(in, n, out);
  });
}

}  // namespace fastreduce::ladder
