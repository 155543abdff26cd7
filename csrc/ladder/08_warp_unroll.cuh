// Rung 8: last warp unrolled (reduce4).
// Against rung 7: once 32 threads are left they finish without
// __syncthreads(). The original relied on warp lockstep through a volatile
// pointer; since Volta a warp's threads may run apart, so each step reads,
// syncs the warp, then writes (volatile keeps the values in shared memory).
// The tree still runs on the run-time block size.
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

// Folds s[0, 64) into s[0] with the first warp.
template <typename A>
__device__ __forceinline__ void volatile_warp_tail(A* s, int tid) {
  if (tid >= 32) return;
  volatile A* v = s;
#pragma unroll
  for (int stride = 32; stride > 0; stride /= 2) {
    const A sum = v[tid] + v[tid + stride];
    __syncwarp();
    v[tid] = sum;
    __syncwarp();
  }
}

struct WarpUnrolledTree {
  template <int kBlock, typename A>
  __device__ static void reduce(A* s, int tid) {
    for (int stride = blockDim.x / 2; stride > 32; stride /= 2) {
      if (tid < stride) s[tid] += s[tid + stride];
      __syncthreads();
    }
    volatile_warp_tail(s, tid);
  }
};

template <typename In>
cudaError_t warp_unroll(const RungArgs& a) {
  return run_tree<256, 2, WarpUnrolledTree, In>(a);
}

}  // namespace fastreduce::ladder
