// Rung 16: recursive multi-pass kernel decomposition.
// Against rung 11: no grid-stride loop and no fixed grid: each block reduces
// one tile of 4 * 256 contiguous elements with the warp-shuffle block reduce
// and the same kernel is launched on the partials, each pass shrinking the
// data 1024-fold, until one value is left (three passes at 2^25).
#pragma once
#include "rung.cuh"

namespace fastreduce::ladder {

template <typename T, typename O>
__global__ void __launch_bounds__(256) tile_kernel(const T* x, int64_t n, O* out) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  const int64_t tile = blockIdx.x * int64_t(4 * 256);
  const int64_t length = n - tile < 4 * 256 ? n - tile : 4 * 256;
  A v = strided_reduce<SumOp<A>>(x + tile, length, threadIdx.x, 256, A(0));
  v = block_allreduce<SumOp<A>>(v, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<O>(v);
}

template <typename In>
cudaError_t recursive_multipass(const RungArgs& a) {
  return multipass<In>(a, 4 * 256, [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    tile_kernel<<<blocks, 256, 0, a.stream>>>(in, n, out);
  });
}

}  // namespace fastreduce::ladder
