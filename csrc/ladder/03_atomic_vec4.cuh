// Rung 3: 16-byte vector loads (float4 for float32), then atomics.
// Against rung 2: each thread first sums its own elements in a register,
// loading 16 bytes at a time (scalar head and tail where the pointer is not
// aligned), so a block issues one shared atomic per thread instead of one per
// element. Bandwidth-bound at last; the order of the atomics still varies.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename In>
__global__ void atomic_vec4_kernel(const In* x, int64_t n, Acc<In>* total) {
  __shared__ Acc<In> block_total;
  if (threadIdx.x == 0) block_total = 0;
  __syncthreads();
  const Acc<In> mine = strided_reduce<SumOp<Acc<In>>>(x, n, blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                                                     int64_t(gridDim.x) * blockDim.x, Acc<In>(0));
  atomic_add(&block_total, mine);
  __syncthreads();
  if (threadIdx.x == 0) atomic_add(total, block_total);
}

template <typename In>
cudaError_t atomic_vec4(const RungArgs& a) {
  return with_atomic_accumulator<In>(a, [&](Acc<In>* total) {
    atomic_vec4_kernel<<<fill_grid(a, 256 * 16, 4), 256, 0, a.stream>>>(static_cast<const In*>(a.x), a.n, total);
  });
}

}  // namespace fastreduce::ladder
