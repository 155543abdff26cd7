// Rung 5: interleaved addressing, non-divergent (reduce1).
// Against rung 4: thread t works on index 2 * stride * t, so the active
// threads are contiguous and whole warps retire together. The strided index
// now makes threads of a warp hit the same shared-memory bank: conflicts.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

struct StridedIndexTree {
  template <int kBlock, typename A>
  __device__ static void reduce(A* s, int tid) {
    for (int stride = 1; stride < kBlock; stride *= 2) {
      const int index = 2 * stride * tid;
      if (index < kBlock) s[index] += s[index + stride];
      __syncthreads();
    }
  }
};

template <typename In>
cudaError_t interleaved_bank(const RungArgs& a) {
  return run_tree<256, 1, StridedIndexTree, In>(a);
}

}  // namespace fastreduce::ladder
