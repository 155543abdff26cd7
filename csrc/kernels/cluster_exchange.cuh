// How the blocks of a thread-block cluster (sm_90) that share a row combine
// their sums: each block pushes its value into every block's inbox with
// st.async, which counts the bytes landed on the receiving block's
// mbarrier; a block waits on its own barrier only. One trip through
// distributed shared memory per exchange, and no cluster-wide barrier but
// the one that publishes the inboxes, whose wait is the first exchange's
// (the row's loads are in flight by then).
#pragma once

#include <cstdint>
#include <cstring>

#include "block_reduce.cuh"

namespace fastreduce {

// Clusters hold at most 16 blocks (beyond 8 with the non-portable opt-in).
constexpr int kClusterBlocksMax = 16;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

namespace cluster {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The address in block `rank`'s shared memory of what is at `local` in ours.
__device__ __forceinline__ uint32_t in_block(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
__device__ __forceinline__ void wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }

// Stores `value` (4, 8 or 16 bytes: a float, a double, or a struct of them)
// at `remote` in another block, counting its bytes on that block's barrier.
template <typename V>
__device__ __forceinline__ void store_async(uint32_t remote, const V& value, uint32_t remote_barrier) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16, "exchanged values are 4, 8 or 16 bytes");
  if constexpr (sizeof(V) == 4) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 :: "r"(remote), "r"(bits), "r"(remote_barrier) : "memory");
  } else if constexpr (sizeof(V) == 8) {
    uint64_t bits;
    memcpy(&bits, &value, 8);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 :: "r"(remote), "l"(bits), "r"(remote_barrier) : "memory");
  } else {
    uint64_t bits[2];
    memcpy(bits, &value, 16);
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [%0], {%1, %2}, [%3];"
                 :: "r"(remote), "l"(bits[0]), "l"(bits[1]), "r"(remote_barrier) : "memory");
  }
}

// Two inboxes that successive exchanges alternate between, each with the
// barrier that completes a phase when every block's value has landed.
constexpr int kExchangedBytesMax = 16;
struct Inboxes {
  alignas(kExchangedBytesMax) unsigned char values[2][kClusterBlocksMax * kExchangedBytesMax];
  uint64_t landed[2];
};

__device__ __forceinline__ Inboxes& inboxes() {
  __shared__ Inboxes boxes;
  return boxes;
}

// Every thread of every block of the cluster, before any exchange: the
// barriers initialised, and published by the arrival that exchange 0 waits
// for.
__device__ __forceinline__ void open_inboxes() {
  if (threadIdx.x == 0) {
    Inboxes& boxes = inboxes();
    for (uint64_t& landed : boxes.landed)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(shared_address(&landed)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  arrive_relaxed();
}

// Exchange `turn` (0, 1, ...) of the value every thread of the block holds
// (of up to 16 bytes), in two halves: push sends this block's value to every
// block's inbox, collect waits until every block's has landed in ours and
// returns them in block order. Work between the two (a next row's loads)
// overlaps the trip. A box is refilled two turns later, which no block
// reaches before every block has read it: a block's push of the turn between
// follows its reads (a barrier of the block between them).
template <typename A>
__device__ __forceinline__ void push(const A& value, int turn, int blocks, int rank) {
  Inboxes& boxes = inboxes();
  const int box = turn & 1;
  A* const values = reinterpret_cast<A*>(boxes.values[box]);
  const uint32_t landed = shared_address(&boxes.landed[box]);
  if (turn == 0) wait();
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(landed), "r"(uint32_t(blocks * sizeof(A))) : "memory");
  if (int(threadIdx.x) < blocks)
    store_async(in_block(shared_address(values + rank), threadIdx.x), value, in_block(landed, threadIdx.x));
}

template <typename A>
__device__ __forceinline__ const A* collect(int turn) {
  Inboxes& boxes = inboxes();
  const uint32_t landed = shared_address(&boxes.landed[turn & 1]);
  const uint32_t parity = (turn >> 1) & 1;
  for (uint32_t done = 0; !done;)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(landed), "r"(parity) : "memory");
  return reinterpret_cast<const A*>(inboxes().values[turn & 1]);
}

template <typename A>
__device__ __forceinline__ const A* gather(const A& value, int turn, int blocks, int rank) {
  push(value, turn, blocks, rank);
  return collect<A>(turn);
}

// Every block's value combined by Op from a collect's inbox (the same bits in
// every block). The barrier in the block reduction before a push separates
// it from these reads.
template <typename Op, typename A>
__device__ __forceinline__ A combine(const A* values, int blocks) {
  const int lane = threadIdx.x % kWarpSize;
  return warp_allreduce<Op>(lane < blocks ? values[lane] : Op::identity());
}

}  // namespace cluster

#endif

}  // namespace fastreduce
