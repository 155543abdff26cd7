// The kernel ladder's one table: name, one-line summary, deterministic or
// not. The CUDA dispatcher, the Python listing (fastreduce_torch.variants()),
// the tests and the benchmarks all iterate it. Adding a rung: one header in
// this folder defining `template <typename In> cudaError_t NAME(const RungArgs&)`,
// included by launch/ladder.cu, and one row here. Every rung sums float32,
// bfloat16 (float accumulation) and int32 (to int64), any length, any alignment.
#pragma once

#define FASTREDUCE_LADDER(ROW)                                                                          \
  ROW(atomic_global, "one global atomicAdd per element", false)                                         \
  ROW(atomic_shared, "shared-memory atomic per element, one global atomic per block", false)            \
  ROW(atomic_vec4, "16-byte vector loads summed per thread, then shared and global atomics", false)     \
  ROW(interleaved_divergent, "shared-memory tree, interleaved addressing, divergent branch", true)       \
  ROW(interleaved_bank, "interleaved addressing without divergence; bank conflicts", true)              \
  ROW(sequential, "sequential addressing: conflict-free shared-memory tree", true)                      \
  ROW(first_add, "two loads per thread, added before the tree", true)                                   \
  ROW(warp_unroll, "last warp unrolled over volatile shared memory with __syncwarp", true)              \
  ROW(complete_unroll, "whole tree unrolled, block size a template parameter", true)                    \
  ROW(grid_stride, "fixed grid, many elements per thread, unrolled tree, two launches", true)           \
  ROW(warp_shuffle, "warp reduction through __shfl_down_sync, one shared word per warp", true)          \
  ROW(cooperative_groups, "cooperative groups: cg::reduce over 32-thread tiles", true)                  \
  ROW(cg_unroll2, "cooperative groups with two loads in flight per iteration", true)                    \
  ROW(cub_block_reduce, "CUB BlockReduce over 16-byte vector loads", true)                              \
  ROW(cub_device_reduce, "CUB DeviceReduce::Sum", true)                                                 \
  ROW(recursive_multipass, "1024-element tiles, the same kernel relaunched on the partials", true)      \
  ROW(two_stage_coarsened, "16 loads per thread, warp then block shuffle stages, recursive", true)      \
  ROW(fastreduce, "the project's kernel: 16-byte loads, 4 in flight, one launch: the last block to finish folds the partials", true)

namespace fastreduce {

struct RungInfo {
  const char* name;
  const char* summary;
  bool deterministic;
};

#define FASTREDUCE_RUNG_INFO(name, summary, deterministic) {#name, summary, deterministic},
inline constexpr RungInfo kLadder[] = {FASTREDUCE_LADDER(FASTREDUCE_RUNG_INFO)};
#undef FASTREDUCE_RUNG_INFO
inline constexpr int kLadderSize = sizeof(kLadder) / sizeof(kLadder[0]);

}  // namespace fastreduce
