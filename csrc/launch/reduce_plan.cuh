// The plan of a reduction (full / rows / columns, how many segments, team
// and vector widths, chosen from its shape, its alignment and the SM count)
// and the launches of reduce_kernels.cuh for any op. Each family of ops
// (reduce.cu, reduce_statistics.cu, reduce_selection.cu) instantiates it in
// its own translation unit, so they compile in parallel.
#pragma once

#include <algorithm>
#include <type_traits>

#include "../kernels/reduce_kernels.cuh"
#include "arrival_counters.h"
#include "launch.h"
#include "reduce.h"

namespace fastreduce {
namespace reduce_plan {

constexpr int kRowThreads = 512;
constexpr int kRowBlocksPerSm = 4;
constexpr int kRowVecsPerThread = 8;    // unsplit long rows: vectors per thread at least
constexpr int kTeamRowMaxLen = 1024;    // rows up to this length get a team of lanes each
constexpr int64_t kMinSegment = 4096;   // elements: below this a split costs more than it buys
constexpr int kColumnBlocksPerSm = 8;
constexpr int64_t kMinColumnRowsPerLane = 16;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  enum class Layout { All, Rows, Columns } layout;
  int64_t segments;  // partials per output element (1: single pass)
  int64_t chunk;     // elements of `len` per segment
  int team;          // Rows: lanes per row, 0 for a whole block
  int vec;           // Columns: columns per thread
  int threads = kRowThreads;  // Rows with a whole block per segment: its size
};

// Resident blocks per SM of the full reduction's grid kernel: the grid is
// one wave of them, so no block waits for a second wave (nor does the last).
template <typename Op, typename In, typename Sink>
int full_blocks_per_sm() {
  static const int blocks = [] {
    int resident = 0;
    const auto kernel = reduce_all_grid_kernel<Op, In, Sink>;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kAllThreads, 0) == cudaSuccess
               ? std::max(resident, 1) : 1;
  }();
  return blocks;
}

inline Plan make_plan(const ReduceProblem& p, size_t elem_size, int sm_count, int full_blocks_per_sm) {
  const int64_t vec = 16 / elem_size;
  if (p.outer == 1 && p.inner == 1) {
    // One wave of blocks, each thread with 4 vectors in flight; up to four
    // blocks' worth, one block alone (its extra rounds cost less than the
    // grid's partials and counter).
    const int64_t per_block = kAllThreads * vec * 4;
    const int64_t blocks = p.len <= 4 * per_block
                               ? 1
                               : std::min<int64_t>(ceil_div(p.len, per_block), int64_t(sm_count) * full_blocks_per_sm);
    return {Plan::Layout::All, std::max<int64_t>(blocks, 1), p.len, 0, 1};
  }
  if (p.inner == 1) {
    if (p.len <= kTeamRowMaxLen) {
      // The smallest team that gives each lane at most 4 vectors.
      const int64_t vecs = ceil_div(p.len, vec);
      int team = 4;
      while (team < 32 && team * 4 < vecs) team *= 2;
      return {Plan::Layout::Rows, 1, p.len, team, 1};
    }
    const int64_t target = int64_t(sm_count) * kRowBlocksPerSm;
    if (p.outer >= target) {
      // Rows enough to fill the GPU unsplit: the fewest threads per row that
      // still give each kRowVecsPerThread vectors, so the loads, not the
      // block's combine tree (ten levels of a Welford merge or a rescale
      // at 512 threads), set the pace; a warp per row at the least.
      const int64_t vecs = ceil_div(p.len, vec);
      int threads = kRowThreads;
      while (threads > kWarpSize && int64_t(threads) * kRowVecsPerThread > vecs) threads /= 2;
      if (threads == kWarpSize) return {Plan::Layout::Rows, 1, p.len, kWarpSize, 1};
      return {Plan::Layout::Rows, 1, p.len, 0, 1, threads};
    }
    const int64_t segments = std::min(ceil_div(target, p.outer), std::max<int64_t>(p.len / kMinSegment, 1));
    // Keep segment starts 16-byte aligned whenever the rows are.
    const int64_t chunk = ceil_div(ceil_div(p.len, segments), vec) * vec;
    return {Plan::Layout::Rows, ceil_div(p.len, chunk), chunk, 0, 1};
  }
  const bool packed = p.inner % vec == 0 && reinterpret_cast<uintptr_t>(p.input) % 16 == 0;
  const int columns_per_thread = packed ? static_cast<int>(vec) : 1;
  const int64_t blocks = ceil_div(p.inner, kColumnTile * columns_per_thread) * p.outer;
  const int64_t target = int64_t(sm_count) * kColumnBlocksPerSm;
  int64_t segments = 1;
  if (blocks < target)
    segments = std::min(ceil_div(target, blocks),
                        std::max<int64_t>(p.len / (kColumnLanes * kMinColumnRowsPerLane), 1));
  const int64_t chunk = std::max<int64_t>(ceil_div(p.len, segments), 1);
  return {Plan::Layout::Columns, std::max<int64_t>(ceil_div(p.len, chunk), 1), chunk, 0, columns_per_thread};
}

template <bool kFinal, typename Op, typename In, typename Sink>
cudaError_t launch_rows(const Plan& plan, int64_t rows, int64_t row_len, int64_t splits, const In* x, Sink out,
                        const Op& op, After after, cudaStream_t stream) {
  const int64_t segments = rows * splits;
  auto run = [&](auto team) {
    constexpr int kTeam = decltype(team)::value;
    const int64_t grid = kTeam == 0 ? segments : ceil_div(segments, kRowThreads / kTeam);
    return launch_kernel(reduce_rows_kernel<Op, In, Sink, kFinal, kTeam>, grid, kTeam == 0 ? plan.threads : kRowThreads,
                         0, stream, after, x, rows, row_len, splits, plan.chunk, out, op);
  };
  switch (plan.team) {
    case 4: return run(std::integral_constant<int, 4>{});
    case 8: return run(std::integral_constant<int, 8>{});
    case 16: return run(std::integral_constant<int, 16>{});
    case 32: return run(std::integral_constant<int, 32>{});
    default: return run(std::integral_constant<int, 0>{});
  }
}

template <typename Op, typename In, typename Sink>
Plan plan_for(const ReduceProblem& p, int sm_count) {
  return make_plan(p, sizeof(In), sm_count, full_blocks_per_sm<Op, In, Sink>());
}

// Workspace of run_reduction<Op, In, Sink> for p: the first pass's
// partials, and for a full reduction room for a counter after them.
template <typename Op, typename In, typename Sink>
size_t workspace_bytes(const ReduceProblem& p, int sm_count) {
  const Plan plan = plan_for<Op, In, Sink>(p, sm_count);
  if (plan.segments == 1) return 0;
  const size_t partials = plan.segments * p.outer * p.inner * sizeof(typename Op::acc_t);
  return plan.layout == Plan::Layout::All ? partials + sizeof(unsigned int) : partials;
}

// Reduces p with `op`, storing to `out`; the partials of a two-pass plan go
// to `workspace` and a second pass folds them (CombinePartials), or for a
// full reduction the last block of the one launch does.
template <typename Op, typename In, typename Sink>
cudaError_t run_reduction(const ReduceProblem& p, const Op& op, Sink out, void* workspace, int sm_count,
                          cudaStream_t stream) {
  using Acc = typename Op::acc_t;
  const auto* x = static_cast<const In*>(p.input);
  auto* partials = static_cast<Acc*>(workspace);
  const CombinePartials<Op> finish_op{op};
  const Plan plan = plan_for<Op, In, Sink>(p, sm_count);
  const bool two_pass = plan.segments > 1;

  cudaError_t err = cudaSuccess;
  switch (plan.layout) {
    case Plan::Layout::All: {
      if (!two_pass)
        return launch_kernel(reduce_all_block_kernel<Op, In, Sink>, 1, kAllThreads, 0, stream, After::Stream, x,
                             p.len, out, op);
      unsigned int* arrivals = arrival_counter(stream);
      if (arrivals == nullptr) {
        arrivals = reinterpret_cast<unsigned int*>(partials + plan.segments);
        if ((err = cudaMemsetAsync(arrivals, 0, sizeof(unsigned int), stream)) != cudaSuccess) return err;
      }
      return launch_kernel(reduce_all_grid_kernel<Op, In, Sink>, plan.segments, kAllThreads, 0, stream,
                           After::Stream, x, p.len, partials, arrivals, out, op);
    }
    case Plan::Layout::Rows: {
      if (!two_pass) return launch_rows<true>(plan, p.outer, p.len, 1, x, out, op, After::Stream, stream);
      err = launch_rows<false>(plan, p.outer, p.len, plan.segments, x, partials, op, After::Stream, stream);
      if (err != cudaSuccess) return err;
      const Plan finish{Plan::Layout::Rows, 1, plan.segments, 32, 1};
      return launch_rows<true>(finish, p.outer, plan.segments, 1, partials, out, finish_op, After::Producer, stream);
    }
    case Plan::Layout::Columns: {
      auto first_pass = [&](auto columns_per_thread) {
        constexpr int kVec = decltype(columns_per_thread)::value;
        const dim3 grid(ceil_div(p.inner, kColumnTile * kVec) * p.outer, plan.segments);
        if (two_pass)
          return launch_kernel(reduce_columns_kernel<Op, In, Acc*, false, kVec>, grid, kColumnThreads, 0, stream,
                               After::Stream, x, p.len, p.inner, plan.segments, plan.chunk, partials, op);
        return launch_kernel(reduce_columns_kernel<Op, In, Sink, true, kVec>, grid, kColumnThreads, 0, stream,
                             After::Stream, x, p.len, p.inner, int64_t(1), plan.chunk, out, op);
      };
      // A tile's partials sit in shared memory: wide accumulators (value and
      // index) take fewer columns per thread so they fit.
      constexpr int kPack = std::min<int>(Vec16<In>::kSize, std::max<int>(1, 128 / sizeof(Acc)));
      err = plan.vec > 1 ? first_pass(std::integral_constant<int, kPack>{})
                         : first_pass(std::integral_constant<int, 1>{});
      if (err != cudaSuccess || !two_pass) return err;
      const dim3 finish_grid(ceil_div(p.inner, kColumnTile) * p.outer, 1);
      return launch_kernel(reduce_columns_kernel<CombinePartials<Op>, Acc, Sink, true, 1, kFinishColumnLanes>,
                           finish_grid, kColumnTile * kFinishColumnLanes, 0, stream, After::Producer, partials, plan.segments, p.inner, int64_t(1),
                           plan.segments, out, finish_op);
    }
  }
  return cudaErrorInvalidValue;
}

// The sink of an op's outputs: one array, or two side by side.
template <typename Sink>
Sink make_sink(const ReduceProblem& p, void* output) {
  if constexpr (std::is_pointer_v<Sink>) {
    return static_cast<Sink>(output);
  } else {
    using First = std::remove_pointer_t<decltype(Sink::first)>;
    using Second = std::remove_pointer_t<decltype(Sink::second)>;
    return {static_cast<First*>(output), static_cast<Second*>(p.second_output)};
  }
}

// The entry points of one family of ops: visit(problem, f) calls
// f(op, TypeTag<In>{}, TypeTag<Sink>{}) or returns cudaErrorInvalidValue.
template <typename Visit>
size_t family_workspace_bytes(const ReduceProblem& problem, int sm_count, Visit&& visit) {
  size_t bytes = 0;
  visit(problem, [&](auto op, auto in, auto sink) {
    bytes = workspace_bytes<decltype(op), typename decltype(in)::type, typename decltype(sink)::type>(problem,
                                                                                                       sm_count);
    return cudaSuccess;
  });
  return bytes;
}

template <typename Visit>
cudaError_t family_reduce(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                          cudaStream_t stream, Visit&& visit) {
  if (problem.outer * problem.inner == 0) return cudaSuccess;
  return visit(problem, [&](auto op, auto in, auto sink) {
    using Sink = typename decltype(sink)::type;
    return run_reduction<decltype(op), typename decltype(in)::type>(problem, op, make_sink<Sink>(problem, output),
                                                                   workspace, sm_count, stream);
  });
}

}  // namespace reduce_plan
}  // namespace fastreduce
