// Rung 9: complete unroll with the block size as a template parameter (reduce5).
// Against rung 8: every loop bound is a compile-time constant, so the whole
// tree unrolls, the dead steps vanish and no loop counter is kept. The block
// size is picked at run time from two instantiations.
#pragma once
#include "08_warp_unroll.cuh"

namespace fastreduce::ladder {

struct UnrolledTree {
  template <int kBlock, typename A>
  __device__ static void reduce(A* s, int tid) {
#pragma unroll
    for (int stride = kBlock / 2; stride > 32; stride /= 2) {
      if (tid < stride) s[tid] += s[tid + stride];
      __syncthreads();
    }
    volatile_warp_tail(s, tid);
  }
};

template <typename In>
cudaError_t complete_unroll(const RungArgs& a) {
  // Large inputs: bigger blocks, fewer partials.
  if (a.n >= (1 << 20)) return run_tree<512, 2, UnrolledTree, In>(a);
  return run_tree<256, 2, UnrolledTree, In>(a);
}

}  // namespace fastreduce::ladder
