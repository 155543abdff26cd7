// Warp and block reductions over any op of reduce_op.h. Every thread gets the
// result (butterfly shuffles), and the combine order is fixed, so results are
// bitwise reproducible. Every kernel of the project reduces through these.
#pragma once

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "reduce_op.h"

namespace fastreduce {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// A butterfly shuffle of any accumulator: arithmetic types directly, a
// struct (Welford moments, value and index) one 32-bit word at a time.
template <typename T>
__device__ __forceinline__ T shuffle_xor(const T& value, int offset) {
  if constexpr (std::is_arithmetic_v<T>) {
    return __shfl_xor_sync(kFullMask, value, offset);
  } else {
    static_assert(sizeof(T) % sizeof(int) == 0, "accumulators are shuffled in 32-bit words");
    constexpr int kWords = sizeof(T) / sizeof(int);
    int words[kWords];
    memcpy(words, &value, sizeof(T));
#pragma unroll
    for (int k = 0; k < kWords; ++k) words[k] = __shfl_xor_sync(kFullMask, words[k], offset);
    T result;
    memcpy(&result, words, sizeof(T));
    return result;
  }
}

// Reduces across aligned groups of kWidth lanes (a power of two up to 32).
template <typename Op, int kWidth = kWarpSize, typename Acc>
__device__ __forceinline__ Acc warp_allreduce(Acc value) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) value = Op::combine(value, shuffle_xor(value, offset));
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

// N consecutive elements loaded as one vector (aligned to the largest power
// of two dividing its size: 16 bytes for the packs of Vec16).
template <typename In, int N>
struct alignas((sizeof(In) * N) & (~(sizeof(In) * N) + 1)) VecN {
  static constexpr int kSize = N;
  In elem[N];
};

template <typename In>
using Vec16 = VecN<In, 16 / sizeof(In)>;

// Called by every thread of a block once it has stored its share of the
// block's partials: whether this block is the last of `blocks` to count
// itself in at *counter. The last one sets the counter back to zero (every
// block has counted itself in) for the next launch. The count is one
// acquire-release add by thread 0 after the block's barrier (its release
// publishes what every thread wrote before the barrier, its acquire in the
// last block orders the reads after it), not a full fence on every thread
// around a relaxed add: full sums 2-6% faster on the H200 (bf16 2^20 6.43 ->
// 6.05 µs, 2^24 13.66 -> 13.15, float32 2^22 9.63 -> 9.15).
__device__ __forceinline__ bool last_to_arrive(unsigned int* counter, unsigned int blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned int, cuda::thread_scope_device> count(*counter);
    last = count.fetch_add(1u, cuda::memory_order_acq_rel) == blocks - 1;
    if (last) count.store(0u, cuda::memory_order_relaxed);
  }
  __syncthreads();
  return last;
}

// A value that another block of this launch wrote, read from L2 (L1 is not
// coherent across SMs): one 16-byte load for 16-byte aligned packs, else
// word by word.
template <typename T>
__device__ __forceinline__ T load_from_other_block(const T* p) {
  static_assert(sizeof(T) % sizeof(unsigned int) == 0, "accumulators are whole 32-bit words");
  T value;
  if constexpr (sizeof(T) == 16 && alignof(T) == 16) {
    const uint4 pack = __ldcg(reinterpret_cast<const uint4*>(p));
    memcpy(&value, &pack, sizeof(T));
  } else {
    auto* words = reinterpret_cast<unsigned int*>(&value);
#pragma unroll
    for (int k = 0; k < int(sizeof(T) / sizeof(unsigned int)); ++k)
      words[k] = __ldcg(reinterpret_cast<const unsigned int*>(p) + k);
  }
  return value;
}

// Folds the elements of v, whose first has index `index` and the rest the
// indices after it: at once where the op can (fold_pack, fold_run), else
// one by one.
template <typename Op, typename In, int N, typename Acc = typename Op::acc_t>
__device__ __forceinline__ Acc fold_vec(const Op& op, Acc acc, const VecN<In, N>& v, int64_t index) {
  if constexpr (FoldsPacks<Op, In, N>::value) {
    return op.fold_pack(acc, v.elem, index);
  } else if constexpr (FoldsRuns<Op, In, N>::value) {
    return op.fold_run(acc, v.elem, index);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) acc = op.fold(acc, v.elem[k], index + k);
    return acc;
  }
}

// x joins acc, which holds an element already, x's index after all of
// acc's (a thread's rows of a column, in order): through the op's
// fold_later where it has one.
template <typename Op, typename In, typename Acc = typename Op::acc_t>
__device__ __forceinline__ Acc fold_later(const Op& op, Acc acc, In x, int64_t index) {
  if constexpr (FoldsLater<Op, In>::value) return op.fold_later(acc, x, index);
  else return op.fold(acc, x, index);
}

// Reduces data[0, n) cooperatively: thread `rank` of `team` threads folds its
// share into `acc`; element i has index first_index + i (for argmax). The
// body uses 16-byte loads, kUnroll of them in flight per thread; the
// unaligned head (storage offsets) and the tail go element-wise. kTrees:
// whether full rounds take the op's fold_tree where it has one.
template <typename Op, int kUnroll = 4, bool kTrees = true, typename In, typename Acc = typename Op::acc_t>
__device__ __forceinline__ Acc strided_reduce(const In* __restrict__ data, int64_t n, int64_t rank,
                                              int64_t team, Acc acc, const Op& op = Op{},
                                              int64_t first_index = 0) {
  if constexpr (16 % sizeof(In) != 0) {  // accumulators of 12 or 24 bytes: one at a time
    for (int64_t i = rank; i < n; i += team) acc = op.fold(acc, data[i], first_index + i);
    return acc;
  } else {
  constexpr int kVec = Vec16<In>::kSize;
  const auto misalign = reinterpret_cast<uintptr_t>(data) % 16;
  int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((16 - misalign) / sizeof(In));
  if (head > n) head = n;
  for (int64_t i = rank; i < head; i += team) acc = op.fold(acc, data[i], first_index + i);
  data += head;
  n -= head;
  first_index += head;

  // Full rounds: kUnroll loads issued before any is used. The last, partial
  // round predicates them, so it too keeps its loads in flight.
  const auto* vecs = reinterpret_cast<const Vec16<In>*>(data);
  const int64_t num_vecs = n / kVec;
  int64_t base = rank;
  for (; base + (kUnroll - 1) * team < num_vecs; base += kUnroll * team) {
    Vec16<In> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = vecs[base + u * team];
    constexpr bool kTree = kTrees && FoldsTrees<Op, In, kUnroll * kVec>::value;
    if constexpr (FoldsPacks<Op, In, kUnroll * kVec>::value || kTree) {
      // The whole round as one pack: one Welford division or rescale a
      // round, not one a vector; a sum's adds as a tree.
      VecN<In, kUnroll * kVec> round;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int k = 0; k < kVec; ++k) round.elem[u * kVec + k] = v[u].elem[k];
      if constexpr (kTree) acc = op.fold_tree(acc, round.elem, first_index + base * kVec);
      else acc = fold_vec(op, acc, round, first_index + base * kVec);
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc = fold_vec(op, acc, v[u], first_index + (base + u * team) * kVec);
    }
  }
  if (base < num_vecs) {
    Vec16<In> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * team < num_vecs) v[u] = vecs[base + u * team];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * team < num_vecs) acc = fold_vec(op, acc, v[u], first_index + (base + u * team) * kVec);
  }

  for (int64_t j = num_vecs * kVec + rank; j < n; j += team)
    acc = op.fold(acc, data[j], first_index + j);
  return acc;
  }
}

}  // namespace fastreduce
