// What every rung of the kernel ladder shares: its arguments, its
// accumulator type, and the two ways a rung finishes a full sum:
//  - multi-pass: a kernel turns n values into one partial per block and is
//    launched again on the partials until one value is left;
//  - atomics: every block adds into one zeroed accumulator.
// The rungs compute sum(x) for float, bfloat16 (float accumulation) and int32
// (int64 accumulation and result, as torch).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../kernels/block_reduce.cuh"
#include "../kernels/ceil_div.h"

namespace fastreduce::ladder {

struct RungArgs {
  const void* x;
  int64_t n;
  void* out;        // one element of torch.sum's output type
  void* workspace;  // ladder_workspace_bytes(n) bytes
  int sm_count;
  cudaStream_t stream;
};

template <typename In>
using Acc = std::conditional_t<std::is_integral_v<In>, int64_t, float>;
template <typename In>
using Out = std::conditional_t<std::is_integral_v<In>, int64_t, In>;

template <typename In>
__device__ __forceinline__ Acc<In> load(const In* x, int64_t i) {
  return static_cast<Acc<In>>(x[i]);
}

// Every multi-pass kernel reads at least this many values per block.
constexpr int64_t kMinElementsPerBlock = 128;
constexpr size_t kCubBytes = 1 << 20;

// Scratch a rung may use: the multi-pass ping-pong buffers (the first level's
// partials, then the second's), or CUB's storage.
inline size_t ladder_workspace_bytes(int64_t n) {
  const int64_t first = ceil_div(n, kMinElementsPerBlock);
  return (first + ceil_div(first, kMinElementsPerBlock) + 16) * sizeof(int64_t) + kCubBytes;
}

// Runs `pass(in, n, out, blocks)` until one value is left. Each pass's kernel
// reads `per_block` values per block; the first pass reads In, later ones the
// accumulator type, and the last writes the output type.
template <typename In, typename Pass>
cudaError_t multipass(const RungArgs& a, int64_t per_block, Pass&& pass) {
  using A = Acc<In>;
  A* ping = static_cast<A*>(a.workspace);
  A* pong = ping + ceil_div(a.n, kMinElementsPerBlock);
  int64_t n = a.n;
  int64_t blocks = ceil_div(n, per_block);
  if (blocks == 1) {
    pass(static_cast<const In*>(a.x), n, static_cast<Out<In>*>(a.out), 1);
    return cudaGetLastError();
  }
  pass(static_cast<const In*>(a.x), n, ping, blocks);
  for (n = blocks; n > 1; n = blocks) {
    blocks = ceil_div(n, per_block);
    if (blocks == 1) pass(static_cast<const A*>(ping), n, static_cast<Out<In>*>(a.out), 1);
    else pass(static_cast<const A*>(ping), n, pong, blocks);
    std::swap(ping, pong);
  }
  return cudaGetLastError();
}

// Fixed-grid rungs: pass 1 with `blocks` blocks over the input, pass 2 with one
// block over their partials.
template <typename In, typename Pass>
cudaError_t two_pass(const RungArgs& a, int64_t blocks, Pass&& pass) {
  using A = Acc<In>;
  if (blocks <= 1) {
    pass(static_cast<const In*>(a.x), a.n, static_cast<Out<In>*>(a.out), 1);
  } else {
    auto* partials = static_cast<A*>(a.workspace);
    pass(static_cast<const In*>(a.x), a.n, partials, blocks);
    pass(static_cast<const A*>(partials), blocks, static_cast<Out<In>*>(a.out), 1);
  }
  return cudaGetLastError();
}

// Grid of a fixed-grid rung: enough blocks to fill the chip, no more than the data needs.
inline int64_t fill_grid(const RungArgs& a, int64_t per_block_iteration, int blocks_per_sm = 8) {
  return std::max<int64_t>(1, std::min<int64_t>(ceil_div(a.n, per_block_iteration),
                                                int64_t(a.sm_count) * blocks_per_sm));
}

// The shared-memory tree rungs (4 to 9) differ only in how many elements a
// thread loads and in the tree over shared memory (`Tree::reduce`, which
// leaves the block's sum in s[0]). Out-of-range loads are padded with 0
// before the barrier, so every thread reaches every barrier.
template <int kBlock, int kLoads, typename Tree, typename T, typename O>
__global__ void __launch_bounds__(kBlock) tree_kernel(const T* x, int64_t n, O* out) {
  __shared__ Acc<T> s[kBlock];
  const int tid = threadIdx.x;
  const int64_t first = blockIdx.x * int64_t(kBlock * kLoads) + tid;
  Acc<T> v = 0;
#pragma unroll
  for (int k = 0; k < kLoads; ++k)
    if (first + k * kBlock < n) v += load(x, first + k * kBlock);
  s[tid] = v;
  __syncthreads();
  Tree::template reduce<kBlock>(s, tid);
  if (tid == 0) out[blockIdx.x] = static_cast<O>(s[0]);
}

template <int kBlock, int kLoads, typename Tree, typename In>
cudaError_t run_tree(const RungArgs& a) {
  return multipass<In>(a, kBlock * kLoads, [&](const auto* in, int64_t n, auto* out, int64_t blocks) {
    tree_kernel<kBlock, kLoads, Tree><<<blocks, kBlock, 0, a.stream>>>(in, n, out);
  });
}

// Sequential addressing (rung 6): the active threads are the first `stride`,
// reading the upper half: no divergence within active warps, no bank conflicts.
struct SequentialTree {
  template <int kBlock, typename A>
  __device__ static void reduce(A* s, int tid) {
    for (int stride = kBlock / 2; stride > 0; stride /= 2) {
      if (tid < stride) s[tid] += s[tid + stride];
      __syncthreads();
    }
  }
};

template <typename A, typename O>
__global__ void cast_kernel(const A* in, O* out) {
  *out = static_cast<O>(*in);
}

// Zeroes the accumulator, runs `launch(accumulator)`, writes the output.
template <typename In, typename Launch>
cudaError_t with_atomic_accumulator(const RungArgs& a, Launch&& launch) {
  using A = Acc<In>;
  auto* total = static_cast<A*>(a.workspace);
  cudaError_t err = cudaMemsetAsync(total, 0, sizeof(A), a.stream);
  if (err != cudaSuccess) return err;
  launch(total);
  cast_kernel<<<1, 1, 0, a.stream>>>(total, static_cast<Out<In>*>(a.out));
  return cudaGetLastError();
}

// atomicAdd for the two accumulator types (int64 through its unsigned twin:
// two's complement makes the wrap-around exact).
__device__ __forceinline__ void atomic_add(float* address, float value) { atomicAdd(address, value); }
__device__ __forceinline__ void atomic_add(int64_t* address, int64_t value) {
  atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(value));
}

}  // namespace fastreduce::ladder
