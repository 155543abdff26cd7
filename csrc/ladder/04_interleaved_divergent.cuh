// Rung 4: interleaved addressing with a divergent branch (reduce0 of the
// classic deck). Each block loads 256 elements into shared memory and halves
// them in a tree where thread t is active when t % (2 * stride) == 0: the
// active threads are scattered over every warp, so warps diverge and the
// modulo is slow. Deterministic; the partials are reduced by launching the
// same kernel again (multi-pass).
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

struct DivergentTree {
  template <int kBlock, typename A>
  __device__ static void reduce(A* s, int tid) {
    for (int stride = 1; stride < kBlock; stride *= 2) {
      if (tid % (2 * stride) == 0) s[tid] += s[tid + stride];
      __syncthreads();
    }
  }
};

template <typename In>
cudaError_t interleaved_divergent(const RungArgs& a) {
  return run_tree<256, 1, DivergentTree, In>(a);
}

}  // namespace fastreduce::ladder
