// Warp and block reductions over any op of reduce_op.h. Every thread gets the
// result (butterfly shuffles), and the combine order is fixed, so results are
// bitwise reproducible. Every kernel of the project reduces through these.
#pragma once

#include <cuda_runtime.h>

#include "reduce_op.h"

namespace fastreduce {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Reduces across aligned groups of kWidth lanes (a power of two up to 32).
template <typename Op, int kWidth = kWarpSize, typename Acc>
__device__ __forceinline__ Acc warp_allreduce(Acc value) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2)
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

// N consecutive elements loaded as one vector.
template <typename In, int N>
struct alignas(sizeof(In) * N) VecN {
  static constexpr int kSize = N;
  In elem[N];
};

template <typename In>
using Vec16 = VecN<In, 16 / sizeof(In)>;

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

  // Full rounds: kUnroll loads issued before any is used. The last, partial
  // round predicates them, so it too keeps its loads in flight.
  const auto* vecs = reinterpret_cast<const Vec16<In>*>(data);
  const int64_t num_vecs = n / kVec;
  int64_t base = rank;
  for (; base + (kUnroll - 1) * team < num_vecs; base += kUnroll * team) {
    Vec16<In> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = vecs[base + u * team];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc = combine_vec<Op>(acc, v[u]);
  }
  if (base < num_vecs) {
    Vec16<In> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * team < num_vecs) v[u] = vecs[base + u * team];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * team < num_vecs) acc = combine_vec<Op>(acc, v[u]);
  }

  for (int64_t j = num_vecs * kVec + rank; j < n; j += team)
    acc = Op::combine(acc, static_cast<Acc>(data[j]));
  return acc;
}

}  // namespace fastreduce
