// Rung 10: multiple elements per thread with a grid-stride loop (reduce6).
// Against rung 9: the grid is sized to fill the chip once, not to the data;
// each thread folds many elements (two per iteration) in registers before the
// unrolled tree, so the tree's cost is paid once per thread, not per element.
// Exactly two launches: the grid's partials are folded by one block.
#pragma once
#include "09_complete_unroll.cuh"

namespace fastreduce::ladder {

template <int kBlock, typename T, typename O>
__global__ void __launch_bounds__(kBlock) grid_stride_kernel(const T* x, int64_t n, O* out) {
  __shared__ Acc<T> s[kBlock];
  const int tid = threadIdx.x;
  Acc<T> v = 0;
  for (int64_t i = blockIdx.x * int64_t(2 * kBlock) + tid; i < n; i += int64_t(2 * kBlock) * gridDim.x) {
    v += load(x, i);
    if (i + kBlock < n) v += load(x, i + kBlock);
  }
  s[tid] = v;
  __syncthreads();
  UnrolledTree::reduce<kBlock>(s, tid);
  if (tid == 0) out[blockIdx.x] = static_cast<O>(s[0]);
}

template <typename In>
cudaError_t grid_stride(const RungArgs& a) {
  constexpr int kBlock = 512;
  return two_pass<In>(a, fill_grid(a, 2 * kBlock, 4), [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    grid_stride_kernel<kBlock><<<blocks, kBlock, 0, a.stream>>>(in, n, out);
  });
}

}  // namespace fastreduce::ladder
