// The norms of many tensors in one pass (the gradient-clipping pattern).
// Every tensor is cut into fixed chunks; pass 1 gives each block one chunk
// and writes its partial, pass 2 gives each tensor one warp that folds its
// chunks' partials in order. Chunking depends only on the sizes, so results
// are bitwise reproducible.
#pragma once

#include "block_reduce.cuh"
#include "dependent_launch.cuh"
#include "dtype.h"
#include "foreach_table.h"

namespace fastreduce {

constexpr int kForeachThreads = 512;

template <typename Half, typename BFloat16, typename F>
__device__ __forceinline__ void visit_float_dtype(DType dtype, F&& f) {
  if (dtype == DType::Half) f(TypeTag<Half>{});
  else if (dtype == DType::BFloat16) f(TypeTag<BFloat16>{});
  else f(TypeTag<float>{});
}

// The tensor owning `chunk`: a search over first_chunk, the same for the
// whole block.
__device__ __forceinline__ int owner_of(const ForeachTable& table, int32_t chunk) {
  int low = 0, high = table.count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (table.first_chunk[middle] <= chunk) low = middle;
    else high = middle - 1;
  }
  return low;
}

template <typename Op, typename Half, typename BFloat16>
__global__ void __launch_bounds__(kForeachThreads)
    foreach_norm_chunks_kernel(const __grid_constant__ ForeachTable table, typename Op::acc_t* partials, Op op) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  allow_dependent_launch();
  const int32_t chunk = blockIdx.x;
  const int t = owner_of(table, chunk);
  const int64_t start = static_cast<int64_t>(chunk - table.first_chunk[t]) * kForeachChunk;
  const int64_t length = min(kForeachChunk, table.numel[t] - start);
  Acc acc = Op::identity();
  visit_float_dtype<Half, BFloat16>(table.dtype[t], [&](auto tag) {
    using In = typename decltype(tag)::type;
    acc = strided_reduce<Op>(static_cast<const In*>(table.inputs[t]) + start, length, threadIdx.x, blockDim.x, acc,
                             op);
  });
  acc = block_allreduce<Op>(acc, scratch);
  if (threadIdx.x == 0) partials[chunk] = acc;
}

template <typename Op, typename Half, typename BFloat16>
__global__ void foreach_norm_finish_kernel(const __grid_constant__ ForeachTable table,
                                           const typename Op::acc_t* partials, Op op) {
  using Acc = typename Op::acc_t;
  wait_for_producer();
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (t >= table.count) return;  // whole warps leave together
  const int lane = threadIdx.x % kWarpSize;
  Acc acc = Op::identity();
  for (int32_t c = table.first_chunk[t] + lane; c < table.first_chunk[t + 1]; c += kWarpSize)
    acc = Op::combine(acc, partials[c]);
  acc = warp_allreduce<Op>(acc);
  if (lane != 0) return;
  visit_float_dtype<Half, BFloat16>(table.dtype[t], [&](auto tag) {
    using Out = typename decltype(tag)::type;
    Out* out = static_cast<Out*>(table.outputs[t]);
    if (table.numel[t] == 1)
      *out = static_cast<Out>(Op::of_one(std::abs(widen_to<Acc>(*static_cast<const Out*>(table.inputs[t])))));
    else
      op.store(out, 0, acc);
  });
}

}  // namespace fastreduce
