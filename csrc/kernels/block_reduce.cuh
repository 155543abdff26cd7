// Warp and block reductions over any op of reduce_op.h. Every thread gets the
// result (butterfly shuffles), and the combine order is fixed, so results are
// bitwise reproducible. Every kernel of the project reduces through these.
#pragma once

#include <cuda_runtime.h>

#include "reduce_op.h"

namespace fastreduce {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename Op, typename Acc>
__device__ __forceinline__ Acc warp_allreduce(Acc value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = Op::combine(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}

// `scratch` holds at least 32 accumulators in shared memory. blockDim.x must be
// a multiple of 32. Ends with a barrier so the caller may reuse `scratch`.
template <typename Op, typename Acc>
__device__ __forceinline__ Acc block_allreduce(Acc value, Acc* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  value = warp_allreduce<Op>(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < num_warps ? scratch[lane] : Op::identity();
  value = warp_allreduce<Op>(value);
  __syncthreads();
  return value;
}

// 16 bytes of In, loaded as one vector.
template <typename In>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(In);
  In elem[kSize];
};

template <typename Op, typename In, typename Acc = typename Op::acc_t>
__device__ __forceinline__ Acc combine_vec(Acc acc, const Vec16<In>& v) {
#pragma unroll
  for (int k = 0; k < Vec16<In>::kSize; ++k) acc = Op::combine(acc, static_cast<Acc>(v.elem[k]));
  return acc;
}

// Reduces data[0, n) cooperatively: thread `rank` of `team` threads folds its
// share into `acc`. The body uses 16-byte loads, kUnroll of them in flight per
// thread; the unaligned head (storage offsets) and the tail go element-wise.
template <typename Op, int kUnroll = 4, typename In, typename Acc = typename Op::acc_t>
__device__ __forceinline__ Acc strided_reduce(const In* __restrict__ data, int64_t n, int64_t rank,
                                              int64_t team, Acc acc) {
  constexpr int kVec = Vec16<In>::kSize;
  const auto misalign = reinterpret_cast<uintptr_t>(data) % 16;
  int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((16 - misalign) / sizeof(In));
  if (head > n) head = n;
  for (int64_t i = rank; i < head; i += team) acc = Op::combine(acc, static_cast<Acc>(data[i]));
  data += head;
  n -= head;

  const auto* vecs = reinterpret_cast<const Vec16<In>*>(data);
  const int64_t num_vecs = n / kVec;
  int64_t i = rank;
  for (; i + (kUnroll - 1) * team < num_vecs; i += kUnroll * team) {
    Vec16<In> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = vecs[i + u * team];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc = combine_vec<Op>(acc, v[u]);
  }
  for (; i < num_vecs; i += team) acc = combine_vec<Op>(acc, vecs[i]);

  for (int64_t j = num_vecs * kVec + rank; j < n; j += team)
    acc = Op::combine(acc, static_cast<Acc>(data[j]));
  return acc;
}

}  // namespace fastreduce
