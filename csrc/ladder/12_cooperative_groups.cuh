// Rung 12: cooperative groups (cg::reduce).
// Against rung 11: the same shape written with cooperative groups: a
// 32-thread tile reduces with cg::reduce (which picks the shuffle, or the
// hardware redux instruction for integers), and the block syncs through its
// group handle. kUnroll loads per iteration are issued before they are
// added (rung 13 sets it to 2).
#pragma once
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include "rung.cuh"

namespace fastreduce::ladder {

namespace cg = cooperative_groups;

template <int kUnroll, typename T, typename O>
__global__ void cg_reduce_kernel(const T* x, int64_t n, O* out) {
  using A = Acc<T>;
  __shared__ A warp_sums[32];
  const cg::thread_block block = cg::this_thread_block();
  const cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  A v = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += kUnroll * stride) {
    A loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) loaded[u] = i + u * stride < n ? load(x, i + u * stride) : A(0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v += loaded[u];
  }
  v = cg::reduce(tile, v, cg::plus<A>());
  if (tile.thread_rank() == 0) warp_sums[tile.meta_group_rank()] = v;
  block.sync();
  if (tile.meta_group_rank() == 0) {
    v = tile.thread_rank() < tile.meta_group_size() ? warp_sums[tile.thread_rank()] : A(0);
    v = cg::reduce(tile, v, cg::plus<A>());
    if (tile.thread_rank() == 0) out[blockIdx.x] = static_cast<O>(v);
  }
}

template <int kUnroll, typename In>
cudaError_t run_cg(const RungArgs& a) {
  return two_pass<In>(a, fill_grid(a, 512 * kUnroll, 4), [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    cg_reduce_kernel<kUnroll><<<blocks, 512, 0, a.stream>>>(in, n, out);
  });
}

template <typename In>
cudaError_t cooperative_groups(const RungArgs& a) {
  return run_cg<1, In>(a);
}

}  // namespace fastreduce::ladder
