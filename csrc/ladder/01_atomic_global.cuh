// Rung 1: one global atomicAdd per element.
// The simplest correct parallel sum: every thread adds its elements straight
// into one accumulator in global memory. Every add serialises on a single L2
// address, so this is the slowest rung by orders of magnitude, and float
// results change from run to run with the order the adds land in.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename In>
__global__ void atomic_global_kernel(const In* x, int64_t n, Acc<In>* total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    atomic_add(total, load(x, i));
}

template <typename In>
cudaError_t atomic_global(const RungArgs& a) {
  return with_atomic_accumulator<In>(a, [&](Acc<In>* total) {
    atomic_global_kernel<<<fill_grid(a, 256), 256, 0, a.stream>>>(static_cast<const In*>(a.x), a.n, total);
  });
}

}  // namespace fastreduce::ladder
