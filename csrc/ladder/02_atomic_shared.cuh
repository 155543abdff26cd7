// Rung 2: per-block shared-memory atomic, then one global atomic per block.
// Against rung 1: the contended adds move to shared memory, one counter per
// block, and global memory sees gridDim.x atomics instead of n. Still
// serialised within each block and still not reproducible for floats.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename In>
__global__ void atomic_shared_kernel(const In* x, int64_t n, Acc<In>* total) {
  __shared__ Acc<In> block_total;
  if (threadIdx.x == 0) block_total = 0;
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    atomic_add(&block_total, load(x, i));
  __syncthreads();
  if (threadIdx.x == 0) atomic_add(total, block_total);
}

template <typename In>
cudaError_t atomic_shared(const RungArgs& a) {
  return with_atomic_accumulator<In>(a, [&](Acc<In>* total) {
    atomic_shared_kernel<<<fill_grid(a, 256), 256, 0, a.stream>>>(static_cast<const In*>(a.x), a.n, total);
  });
}

}  // namespace fastreduce::ladder
