// The plan of a reduction (full / rows / columns, how many segments, team
// and vector widths, chosen from its shape, its alignment and the SM count)
// and the launches of reduce_kernels.cuh for any op. Each family of ops
// (reduce.cu, reduce_statistics.cu, reduce_selection.cu) instantiates it in
// its own translation unit, so they compile in parallel.
#pragma once

#include <algorithm>
#include <type_traits>

#include "../kernels/ceil_div.h"
#include "../kernels/reduce_kernels.cuh"
#include "arrival_counters.h"
#include "launch.h"
#include "reduce.h"

namespace fastreduce {
namespace reduce_plan {

constexpr int kRowThreads = 512;
constexpr int kRowBlocksPerSm = 4;
constexpr int kRowVecsPerThread = 8;    // unsplit long rows: vectors per thread at least
constexpr int kRowFillThreads = 768;    // rows of the costly folds: threads an SM at least
constexpr int kTeamRowMaxLen = 1024;    // rows up to this length get a team of lanes each
constexpr int kTeamVecsPerLane = 4;     // short rows: vectors a lane at most
constexpr int64_t kMinSegment = 4096;   // elements: below this a split costs more than it buys
constexpr int64_t kMinColumnSegmentRows = 128;  // fewer partials per column: a cheaper second pass

struct Plan {
  enum class Layout { All, Rows, Columns } layout;
  int64_t segments;  // blocks per row (All, Rows) or partials per output element (Columns); 1: unsplit
  int64_t chunk;     // Columns: rows of `len` per segment
  int team;          // Rows: lanes per row, 0 for a whole block; Columns: threads across a tile
  int vec;           // Columns: columns per thread
  int threads = kRowThreads;  // Rows with a whole block per row: its size
};

// Threads across a column tile for `packs` vectors of `pack_bytes` each: the
// width (32 down to 2) that leaves the fewest threads without columns, the
// widest among equals; a row of a tile spans a 32-byte sector at least.
inline int column_tile_threads(int64_t packs, int64_t pack_bytes) {
  int best = kColumnTile;
  for (int width = kColumnTile / 2; width >= 2 && width * pack_bytes >= 32; width /= 2)
    if (ceil_div(packs, width) * width < ceil_div(packs, best) * best) best = width;
  return best;
}

// Threads across a tile of the second pass (a column each): narrower, down
// to a 32-byte sector of partials and 2 threads, while a grid of full tiles
// would cover under an eighth of the SMs; its lanes then walk fewer partials
// each. (Narrowing grids that already cover the SMs only deepens the trees
// of the ops with costly combines.)
inline int finish_tile_threads(int64_t inner, int64_t outer, size_t acc_bytes, int sm_count) {
  int width = kColumnTile;
  while (width > 2 && width / 2 * acc_bytes >= 32 && ceil_div(inner, width) * outer * 8 < sm_count) width /= 2;
  return width;
}

// What a plan needs to know of an op's kernels: the blocks per SM of the
// split-rows kernel (kSplitRowsPerSm at most) and the resident ones of the
// column kernels' first passes (a grid of at most one wave of them leaves no
// block waiting for a second wave, nor the last one), and the columns per
// thread of the packed column kernel.
struct KernelFacts {
  int split_rows;
  int columns_single;  // a column per thread
  int columns_packed;  // packs, 32 threads across
  int columns_narrow;  // packs, fewer threads across
  int column_pack;
  int row_vecs;   // unsplit long rows: vectors a thread at least (kRowVecs)
  int team_vecs;  // short rows: vectors a lane at most (kTeamVecs)
};

inline Plan make_plan(const ReduceProblem& p, size_t elem_size, int sm_count, const KernelFacts& facts) {
  const int64_t vec = 16 / elem_size;
  if (p.outer == 1 && p.inner == 1) {
    // One wave of blocks, each thread with 4 vectors in flight; up to four
    // blocks' worth, one block alone (its extra rounds cost less than the
    // grid's partials and counter).
    const int64_t per_block = kAllThreads * vec * 4;
    const int64_t blocks = p.len <= 4 * per_block
                               ? 1
                               : std::min<int64_t>(ceil_div(p.len, per_block), int64_t(sm_count) * facts.split_rows);
    return {Plan::Layout::All, std::max<int64_t>(blocks, 1), p.len, 0, 1};
  }
  if (p.inner == 1) {
    const int64_t vecs = ceil_div(p.len, vec);
    // Whether a grid of `threads` a row keeps kRowFillThreads threads an SM.
    const auto fills = [&](int64_t threads) { return p.outer * threads >= int64_t(sm_count) * kRowFillThreads; };
    if (p.len <= kTeamRowMaxLen) {
      // The smallest team that gives each lane at most facts.team_vecs
      // vectors; the costly folds' (more vectors a lane) no smaller than
      // fills the GPU.
      const bool costly = facts.team_vecs > kTeamVecsPerLane;
      int team = 4;
      while (team < 32 && (int64_t(team) * facts.team_vecs < vecs || (costly && !fills(team)))) team *= 2;
      return {Plan::Layout::Rows, 1, p.len, team, 1};
    }
    if (p.outer >= int64_t(sm_count) * kRowBlocksPerSm) {
      // Rows enough to fill the GPU unsplit: the fewest threads per row that
      // still give each facts.row_vecs vectors, so the loads, not the
      // block's combine tree (ten levels of a Welford merge or a rescale
      // at 512 threads), set the pace; a warp per row at the least, or for
      // the costly folds (more vectors a thread) a team of 4 lanes, no
      // fewer than fill the GPU.
      const bool costly = facts.row_vecs > kRowVecsPerThread;
      const int least = costly ? 4 : kWarpSize;
      int threads = kRowThreads;
      while (threads > least && int64_t(threads) * facts.row_vecs > vecs && (!costly || fills(threads / 2)))
        threads /= 2;
      if (threads <= kWarpSize) return {Plan::Layout::Rows, 1, p.len, threads, 1};
      return {Plan::Layout::Rows, 1, p.len, 0, 1, threads};
    }
    // Few long rows: at most one wave of the split-rows kernel's blocks.
    const int64_t resident = int64_t(sm_count) * facts.split_rows;
    const int64_t splits =
        std::min(std::max<int64_t>(resident / p.outer, 1), std::max<int64_t>(p.len / kMinSegment, 1));
    return {Plan::Layout::Rows, splits, p.len, 0, 1};
  }
  const bool packed = p.inner % vec == 0 && reinterpret_cast<uintptr_t>(p.input) % 16 == 0;
  const int pack = facts.column_pack;
  const int columns_per_thread = packed ? pack : 1;
  const int tile_threads = packed ? column_tile_threads(p.inner / pack, pack * elem_size) : kColumnTile;
  const int64_t blocks = ceil_div(p.inner, int64_t(tile_threads) * columns_per_thread) * p.outer;
  const int per_sm = !packed                     ? facts.columns_single
                     : tile_threads == kColumnTile ? facts.columns_packed
                                                   : facts.columns_narrow;
  const int64_t resident = int64_t(sm_count) * per_sm;
  int64_t segments = 1;
  if (blocks < resident)
    segments = std::min(resident / blocks, std::max<int64_t>(p.len / kMinColumnSegmentRows, 1));
  const int64_t chunk = std::max<int64_t>(ceil_div(p.len, segments), 1);
  return {Plan::Layout::Columns, std::max<int64_t>(ceil_div(p.len, chunk), 1), chunk, tile_threads,
          columns_per_thread};
}

template <typename Op, typename In, typename Sink>
cudaError_t launch_rows(const Plan& plan, int64_t rows, int64_t row_len, const In* x, Sink out, const Op& op,
                        cudaStream_t stream) {
  auto run = [&](auto team) {
    constexpr int kTeam = decltype(team)::value;
    const int64_t grid = kTeam == 0 ? rows : ceil_div(rows, kRowThreads / kTeam);
    if constexpr (kTeam == 0 && kMomentRows<Op, In>)
      if (plan.threads == kMomentRowThreads)
        return launch_kernel(reduce_moment_rows_kernel<Op, In, Sink>, grid, kMomentRowThreads, 0, stream,
                             After::Stream, x, rows, row_len, out, op);
    return launch_kernel(reduce_rows_kernel<Op, In, Sink, kTeam>, grid, kTeam == 0 ? plan.threads : kRowThreads, 0,
                         stream, After::Stream, x, rows, row_len, out, op);
  };
  switch (plan.team) {
    case 4: return run(std::integral_constant<int, 4>{});
    case 8: return run(std::integral_constant<int, 8>{});
    case 16: return run(std::integral_constant<int, 16>{});
    case 32: return run(std::integral_constant<int, 32>{});
    default: return run(std::integral_constant<int, 0>{});
  }
}

// Wide accumulators (Welford moments, value and index) take fewer columns per
// thread: 16 words of them at most, so a tile's partials fit in shared memory
// and the kernel in registers (8 columns of moments a thread held bfloat16
// variances to 2 blocks per SM, 94 registers; 4 columns fit 4, 61).
//
// Ops that fold packs (var's moments, logsumexp; any/all of bytes) fold 8
// rows of 8 bytes of columns a lane at once over inputs narrower than 4
// bytes: one merge (a division, a rescale) every 8 rows, a byte column's 8
// rows tested as one word (H200, first pass at (65536, 768) dim 0, µs, 4 ->
// 8 rows: var_mean bfloat16 43.7 -> 37.5, float16 39.7 -> 33.2, logsumexp
// bfloat16 48.9 -> 42.6; any bool, 16 -> 8 columns, 35.3 -> 28.5, at (8192,
// 8192) 46.5 -> 35.0; float32 inputs gain nothing, argmax, which folds no
// packs, loses: 45.6 -> 49.0; bench/micro/column_walk.cu).
template <typename Op, typename In>
constexpr bool kEightRowFolds = sizeof(In) <= 2 && FoldsPacks<Op, In, 8>::value;
template <typename Op, typename In>
constexpr int kColumnRows = kEightRowFolds<Op, In> ? 8 : 4;
template <typename Op, typename In>
constexpr int kColumnPack =
    kEightRowFolds<Op, In> ? 8 / sizeof(In)
                           : std::min<int>(Vec16<In>::kSize, std::max<int>(1, 64 / sizeof(typename Op::acc_t)));

// The tile width a packed first pass is compiled for when its tiles are
// full: kColumnTile, or 0 (taken at run time) for two-byte inputs, whose
// kernels compiled for full tiles ran 10-30% slower than the same tiles at a
// run-time width (H200, first pass at (65536, 768) dim 0, µs: sum bfloat16
// 31.3 -> 27.4, var_mean 61.1 -> 42.2, argmax 59.0 -> 44.9, sum int16 44.7 ->
// 31.8; float32, int32, float64 and uint8 lose 1-5% at a run-time width),
// and for the eight-row folds of bytes (measured at run-time widths only).
template <typename Op, typename In>
constexpr int kFullTileWidth = sizeof(In) == 2 || kEightRowFolds<Op, In> ? 0 : kColumnTile;

// The costly folds (var's moments and logsumexp's rescales by packs,
// argmax's runs) over two-byte inputs and float32 take 64 or 32 vectors a
// thread (16 bytes each), not kRowVecsPerThread (long rows) nor
// kTeamVecsPerLane (short rows): fewer threads a row, so fewer combines and
// more rounds of loads a thread. H200, µs, as the plan ran them -> 32 or 64
// vectors a thread (bench/micro/costly_folds.cu): bfloat16 (8192, 8192)
// var_mean 39.8 -> 35.9, logsumexp 45.6 -> 37.3, argmax 50.7 -> 39.2;
// (2048, 32768) 45.7 -> 36.7, 50.1 -> 38.5, 51.7 -> 40.6; (65536, 2048) 74.2
// -> 66.6, 82.8 -> 69.9, 103.0 -> 75.0; (65536, 1024) 46.7 -> 36.3, 54.6 ->
// 38.5, 64.1 -> 44.1; float16 as bfloat16; float32 (8192, 8192) logsumexp
// 69.8 -> 66.2, argmax 67.7 -> 66.5; (32768, 2048) 71.1 -> 66.2, 69.9 ->
// 66.2; (131072, 512) var_mean 76.2 -> 67.4, logsumexp 73.3 -> 66.8, argmax
// 72.3 -> 67.5. float32 var's long rows (reduce_moment_rows_kernel's at 512
// threads) move by -2% to +4% and keep 8; int32 argmax loses 1% and keeps
// 8. Fewer than kRowFillThreads threads an SM lose: bfloat16 (1024, 32768)
// logsumexp 22.4 at 128 threads a row, 24.2 at 64.
template <typename Op, typename In>
constexpr bool kCostlyFold =
    (FoldsPacks<Op, In, 4 * Vec16<In>::kSize>::value || FoldsRuns<Op, In, Vec16<In>::kSize>::value) &&
    (sizeof(In) == 2 || std::is_same_v<In, float>);
template <typename Op, typename In>
constexpr int kRowVecs = kCostlyFold<Op, In> && !kMomentRows<Op, In> ? 128 / sizeof(In) : kRowVecsPerThread;
template <typename Op, typename In>
constexpr int kTeamVecs = kCostlyFold<Op, In> ? 128 / sizeof(In) : kTeamVecsPerLane;

// The split-rows kernel's grid: two blocks an SM at most, though float sums
// fit four. Full sums on the H200 (bench/micro/costly_folds.cu `bytes` and
// `full`), µs, four blocks an SM -> two: bf16 2^25 21.06 -> 20.74 and 22.75
// -> 22.40, 2^27 67.17 -> 66.78; float32 2^24 20.77 -> 20.58.
constexpr int kSplitRowsPerSm = 2;

template <typename Op, typename In, typename Sink>
const KernelFacts& kernel_facts() {
  using Acc = typename Op::acc_t;
  constexpr int kPack = kColumnPack<Op, In>, kRows = kColumnRows<Op, In>;
  auto per_sm = [](auto kernel, int threads) { return std::max(resident_blocks(kernel, threads), 1); };
  static const KernelFacts facts{
      std::min(per_sm(reduce_split_rows_kernel<Op, In, Sink>, kAllThreads), kSplitRowsPerSm),
      per_sm(reduce_columns_kernel<Op, In, Acc*, false, 1, kColumnTile>, kColumnThreads),
      per_sm(reduce_columns_kernel<Op, In, Acc*, false, kPack, kFullTileWidth<Op, In>, kColumnThreads, kRows>,
             kColumnThreads),
      per_sm(reduce_columns_kernel<Op, In, Acc*, false, kPack, 0, kColumnThreads, kRows>, kColumnThreads), kPack,
      kRowVecs<Op, In>, kTeamVecs<Op, In>};
  return facts;
}

template <typename Op, typename In, typename Sink>
Plan plan_for(const ReduceProblem& p, int sm_count) {
  return make_plan(p, sizeof(In), sm_count, kernel_facts<Op, In, Sink>());
}

// Split rows and full reductions: rows of segments partials and a counter
// for each row after them (used when the pool of arrival counters has none).
template <typename Acc>
size_t split_rows_counters_offset(const Plan& plan, int64_t rows) {
  return ceil_div(plan.segments * rows * sizeof(Acc), sizeof(unsigned int)) * sizeof(unsigned int);
}

// Workspace of run_reduction<Op, In, Sink> for p: the first pass's partials,
// and for split rows room for their counters after them.
template <typename Op, typename In, typename Sink>
size_t workspace_bytes(const ReduceProblem& p, int sm_count) {
  using Acc = typename Op::acc_t;
  const Plan plan = plan_for<Op, In, Sink>(p, sm_count);
  if (plan.segments == 1) return 0;
  if (plan.layout == Plan::Layout::Columns) return plan.segments * p.outer * p.inner * sizeof(Acc);
  return split_rows_counters_offset<Acc>(plan, p.outer) + p.outer * sizeof(unsigned int);
}

// Reduces p with `op`, storing to `out`. Split rows (a full reduction is one
// row) run in one launch whose last block of each row folds the row's
// partials; split columns leave their partials in `workspace` for a second
// pass (CombinePartials).
template <typename Op, typename In, typename Sink>
cudaError_t run_reduction(const ReduceProblem& p, const Op& op, Sink out, void* workspace, int sm_count,
                          cudaStream_t stream) {
  using Acc = typename Op::acc_t;
  const auto* x = static_cast<const In*>(p.input);
  auto* partials = static_cast<Acc*>(workspace);
  const Plan plan = plan_for<Op, In, Sink>(p, sm_count);
  const bool split = plan.segments > 1;

  cudaError_t err = cudaSuccess;
  switch (plan.layout) {
    case Plan::Layout::All:
    case Plan::Layout::Rows: {
      if (!split && plan.layout == Plan::Layout::All)
        return launch_kernel(reduce_all_block_kernel<Op, In, Sink>, 1, kAllThreads, 0, stream, After::Stream, x,
                             p.len, out, op);
      if (!split) return launch_rows(plan, p.outer, p.len, x, out, op, stream);
      unsigned int* arrivals = arrival_counters(stream, p.outer);
      if (arrivals == nullptr) {
        arrivals = reinterpret_cast<unsigned int*>(static_cast<char*>(workspace) +
                                                   split_rows_counters_offset<Acc>(plan, p.outer));
        if ((err = cudaMemsetAsync(arrivals, 0, p.outer * sizeof(unsigned int), stream)) != cudaSuccess) return err;
      }
      const dim3 grid(plan.segments, p.outer);
      return launch_kernel(reduce_split_rows_kernel<Op, In, Sink>, grid, kAllThreads, 0, stream, After::Stream, x,
                           p.len, partials, arrivals, out, op);
    }
    case Plan::Layout::Columns: {
      const int64_t tiles = ceil_div(p.inner, int64_t(plan.team) * plan.vec);
      auto first_pass = [&](auto columns_per_thread, auto tile_threads, auto rows) {
        constexpr int kVec = decltype(columns_per_thread)::value, kTile = decltype(tile_threads)::value;
        constexpr int kRows = decltype(rows)::value;
        const dim3 grid(tiles * p.outer, plan.segments);
        if (split)
          return launch_kernel(reduce_columns_kernel<Op, In, Acc*, false, kVec, kTile, kColumnThreads, kRows>, grid,
                               kColumnThreads, 0, stream, After::Stream, x, p.len, p.inner, plan.segments,
                               plan.chunk, plan.team, partials, op);
        return launch_kernel(reduce_columns_kernel<Op, In, Sink, true, kVec, kTile, kColumnThreads, kRows>, grid,
                             kColumnThreads, 0, stream, After::Stream, x, p.len, p.inner, int64_t(1), plan.chunk,
                             plan.team, out, op);
      };
      using Pack = std::integral_constant<int, kColumnPack<Op, In>>;
      using Single = std::integral_constant<int, 1>;
      using FullTile = std::integral_constant<int, kColumnTile>;
      using NarrowTile = std::integral_constant<int, 0>;
      using PackedFullTile = std::integral_constant<int, kFullTileWidth<Op, In>>;
      using FourRows = std::integral_constant<int, 4>;
      using PackedRows = std::integral_constant<int, kColumnRows<Op, In>>;
      err = plan.vec == 1              ? first_pass(Single{}, FullTile{}, FourRows{})
            : plan.team == kColumnTile ? first_pass(Pack{}, PackedFullTile{}, PackedRows{})
                                       : first_pass(Pack{}, NarrowTile{}, PackedRows{});
      if (err != cudaSuccess || !split) return err;
      const CombinePartials<Op> finish_op{op};
      const int finish_tile = finish_tile_threads(p.inner, p.outer, sizeof(Acc), sm_count);
      const dim3 finish_grid(ceil_div(p.inner, finish_tile) * p.outer, 1);
      // Full tiles keep their compile-time width (fewer registers); narrow
      // ones take it at run time.
      auto finish = [&](auto tile, auto threads) {
        constexpr int kTile = decltype(tile)::value, kThreads = decltype(threads)::value;
        return launch_kernel(reduce_columns_kernel<CombinePartials<Op>, Acc, Sink, true, 1, kTile, kThreads>,
                             finish_grid, kThreads, 0, stream, After::Producer, partials, plan.segments, p.inner,
                             int64_t(1), plan.segments, finish_tile, out, finish_op);
      };
      using FewLanes = std::integral_constant<int, kColumnThreads>;
      using ManyLanes = std::integral_constant<int, kFinishColumnThreads>;
      if (plan.segments <= kFewSegments)
        return finish_tile == kColumnTile ? finish(FullTile{}, FewLanes{}) : finish(NarrowTile{}, FewLanes{});
      return finish_tile == kColumnTile ? finish(FullTile{}, ManyLanes{}) : finish(NarrowTile{}, ManyLanes{});
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
