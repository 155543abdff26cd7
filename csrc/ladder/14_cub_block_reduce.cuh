// Rung 14: CUB BlockReduce.
// Against rung 12: the block-wide step is CUB's (warp reductions plus its own
// shared-memory layout, tuned per architecture); the loads are 16-byte
// vectors through the project's strided loop. Two launches, fixed grid.
#pragma once
#include <cub/block/block_reduce.cuh>

#include "rung.cuh"

namespace fastreduce::ladder {

template <int kBlock, typename T, typename O>
__global__ void __launch_bounds__(kBlock) cub_block_kernel(const T* x, int64_t n, O* out) {
  using A = Acc<T>;
  using BlockReduce = cub::BlockReduce<A, kBlock>;
  __shared__ typename BlockReduce::TempStorage temp;
  const A v = strided_reduce<SumOp<A>>(x, n, blockIdx.x * int64_t(kBlock) + threadIdx.x,
                                      int64_t(gridDim.x) * kBlock, A(0));
  const A total = BlockReduce(temp).Sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<O>(total);
}

template <typename In>
cudaError_t cub_block_reduce(const RungArgs& a) {
  constexpr int kBlock = 512;
  return two_pass<In>(a, fill_grid(a, kBlock * 16, 4), [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    cub_block_kernel<kBlock><<<blocks, kBlock, 0, a.stream>>>(in, n, out);
  });
}

}  // namespace fastreduce::ladder
