// The reduction kernels behind every op of the reduction family (sum, mean,
// prod, amax, amin, var/std, logsumexp, norm, argmax/argmin, aminmax,
// any/all): each kernel is generic over an op (reduce_op.h's contract) and
// a sink that the op stores its results to.
//
// Every problem is a view (outer, len, inner) of a dense buffer, reduced over
// `len`. Large reductions are decomposed into two passes (CUB's shape): pass 1
// folds fixed slices into accumulator partials, pass 2 folds the partials and
// finalizes. Slicing depends only on the shape and the SM count, never on
// timing, so results are bitwise reproducible. Full reductions and split rows
// run both passes in one launch (the last block of a row folds its
// partials); columns run pass 2 as a programmatic dependent of pass 1 (the
// column kernel opens with begin_pass<kFinal>()).
#pragma once

#include "block_reduce.cuh"
#include "dependent_launch.cuh"
#include "statistic_ops.h"

namespace fastreduce {

// A first pass lets the second pass launch at once (it waits for our writes
// anyway); a pass that may read a first pass's partials waits for them.
template <bool kFinal>
__device__ __forceinline__ void begin_pass() {
  if constexpr (kFinal) wait_for_producer();
  else allow_dependent_launch();
}

// A first pass writes accumulator partials (the sink is an acc_t array); a
// final pass lets the op store its result.
template <bool kFinal, typename Op, typename Sink>
__device__ __forceinline__ void store_result(const Op& op, Sink out, int64_t index, typename Op::acc_t acc) {
  if constexpr (kFinal) op.store(out, index, acc);
  else out[index] = acc;
}

// Full reductions run blocks of kAllThreads.
constexpr int kAllThreads = 512;
// Float accumulation is compiled for four blocks per SM (32 registers): 2048
// threads with four 16-byte loads in flight each, the read probe's occupancy.
// Wider accumulators would spill at that budget.
template <typename Op>
constexpr int kAllMinBlocks = std::is_same_v<typename Op::acc_t, float> ? 4 : 1;

// x[0, n) in one block (small n).
template <typename Op, typename In, typename Sink>
__global__ void __launch_bounds__(kAllThreads, kAllMinBlocks<Op>)
    reduce_all_block_kernel(const In* __restrict__ x, int64_t n, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  Acc acc = strided_reduce<Op>(x, n, threadIdx.x, blockDim.x, Op::identity(), op);
  acc = block_allreduce<Op>(acc, scratch);
  if (threadIdx.x == 0) op.store(out, 0, acc);
}

// Rows of x (row_len elements each, blockIdx.y the row) in one launch of
// gridDim.x blocks a row (CUB's two passes, the second folded into the
// first): each block folds its interleaved share of the row into
// partials[row * gridDim.x + blockIdx.x]; the row's last block to finish,
// found by counting arrivals at arrivals[row], folds the row's partials in
// index order and stores out[row]. Which block comes last varies; the
// partials and their fold do not: bitwise reproducible. A full reduction is
// one row.
template <typename Op, typename In, typename Sink>
__global__ void __launch_bounds__(kAllThreads, kAllMinBlocks<Op>)
    reduce_split_rows_kernel(const In* __restrict__ x, int64_t row_len, typename Op::acc_t* partials,
                             unsigned int* arrivals, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  const int64_t row = blockIdx.y;
  const int64_t rank = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t team = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Acc acc = strided_reduce<Op>(x + row * row_len, row_len, rank, team, Op::identity(), op);
  acc = block_allreduce<Op>(acc, scratch);
  Acc* row_partials = partials + row * gridDim.x;
  if (threadIdx.x == 0) row_partials[blockIdx.x] = acc;
  if (!last_to_arrive(arrivals + row, gridDim.x)) return;
  Acc total = Op::identity();
  for (unsigned int i = threadIdx.x; i < gridDim.x; i += blockDim.x)
    total = Op::combine(total, load_from_other_block(row_partials + i));
  total = block_allreduce<Op>(total, scratch);
  if (threadIdx.x == 0) op.store(out, row, total);
}

// Whole rows of a (rows, row_len) matrix, each reduced by a team of kTeam
// lanes (short rows; a power of two up to 32) or, with kTeam == 0, by the
// whole block.
template <typename Op, typename In, typename Sink, int kTeam>
__device__ __forceinline__ void reduce_rows(const In* __restrict__ x, int64_t rows, int64_t row_len, Sink out,
                                            const Op& op) {
  using Acc = typename Op::acc_t;
  constexpr bool kWholeBlock = kTeam == 0;
  __shared__ Acc scratch[kWarpSize];
  const int64_t row =
      kWholeBlock ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * (blockDim.x / kTeam) + threadIdx.x / kTeam;
  // Lanes past the last row still join the shuffles, with nothing to read.
  const bool valid = row < rows;
  const int64_t rank = kWholeBlock ? threadIdx.x : threadIdx.x % kTeam;
  const int64_t team = kWholeBlock ? blockDim.x : kTeam;
  // Teams of 4 lanes (rows of up to 64 floats) keep the chain of adds: with
  // fold_tree compiled in they ran 8-20% slower, though at the same
  // registers and, at 32 floats, without a full round (bench/micro/row_sums.cu).
  constexpr bool kTrees = kTeam == 0 || kTeam >= 8;
  Acc acc = strided_reduce<Op, 4, kTrees>(x + (valid ? row * row_len : 0), valid ? row_len : 0, rank, team,
                                          Op::identity(), op);
  if constexpr (kWholeBlock) acc = block_allreduce<Op>(acc, scratch);
  else acc = warp_allreduce<Op, kTeam>(acc);
  if (valid && rank == 0) op.store(out, row, acc);
}

template <typename Op, typename In, typename Sink, int kTeam>
__global__ void reduce_rows_kernel(const In* __restrict__ x, int64_t rows, int64_t row_len, Sink out, Op op) {
  reduce_rows<Op, In, Sink, kTeam>(x, rows, row_len, out, op);
}

// Whether rows of Op over In in blocks of kMomentRowThreads take
// reduce_moment_rows_kernel.
template <typename Op, typename In>
constexpr bool kMomentRows = std::is_same_v<typename Op::acc_t, Moments<float>> && std::is_same_v<In, float>;
constexpr int kMomentRowThreads = 512;

// Rows of float Welford moments in blocks of 512 threads, compiled for three
// blocks an SM (40 registers): left free they took 48, two blocks (float32
// var_mean (4096, 16384) dim 1: 81.4 -> 74.6 µs on the H200; rows of
// 2048-8192, in smaller blocks, gained nothing). Other ops keep
// reduce_rows_kernel: bounds change ptxas's choices there.
template <typename Op, typename In, typename Sink>
__global__ void __launch_bounds__(kMomentRowThreads, 3)
    reduce_moment_rows_kernel(const In* __restrict__ x, int64_t rows, int64_t row_len, Sink out, Op op) {
  reduce_rows<Op, In, Sink, 0>(x, rows, row_len, out, op);
}

constexpr int kColumnTile = 32;  // threads across the columns of a tile at most: one warp
constexpr int kColumnThreads = 256;
// The second pass walks the partials of a tall column (hundreds of segments)
// with 32 rows at once: latency, not bandwidth, bounds it. A few segments
// take blocks of 8 rows, so that a narrow output still spreads over the SMs.
constexpr int kFinishColumnThreads = 1024;
constexpr int kFewSegments = 32;  // at most 4 partials a lane in blocks of kColumnThreads

// Columns of an (outer, len, inner) view: out[(o * splits + s) * inner + i] folds
// x[o, r, i] for r in segment s. blockIdx.x enumerates (o, column tile),
// blockIdx.y the segment. A tile is kTileThreads threads across (0: the
// argument tile_width; a power of two from 2 to 32, fewer for narrow
// matrices so that no lane idles), each owning kVec adjacent columns loaded
// as one vector (kVec > 1 needs inner % kVec == 0 and an aligned x); the
// block's kThreads / tile_threads lanes of them walk the rows, kUnroll
// rows in flight each, and then fold their partials as a tree. A
// compile-time width spares the registers that keep Welford moments at four
// blocks per SM (reduce_plan.cuh's kFullTileWidth says where the plan takes
// it).
template <typename Op, typename In, typename Sink, bool kFinal, int kVec, int kTileThreads,
          int kThreads = kColumnThreads, int kUnroll = 4>
__global__ void __launch_bounds__(kThreads)
    reduce_columns_kernel(const In* __restrict__ x, int64_t len, int64_t inner, int64_t splits,
                          int64_t chunk, int tile_width, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  using Pack = VecN<In, kVec>;
  // lanes rows of tile_columns + 1 (the pad spreads a column's lanes over
  // banks); tile_threads >= 2 keeps the pads within kThreads / 2.
  __shared__ Acc partial[kThreads * kVec + kThreads / 2];
  begin_pass<kFinal>();
  const int tile_threads = kTileThreads != 0 ? kTileThreads : tile_width;
  const int lanes = kThreads / tile_threads;
  const int tile_columns = tile_threads * kVec;
  const int pitch = tile_columns + 1;
  const int tx = threadIdx.x % tile_threads;
  const int ty = threadIdx.x / tile_threads;
  const int64_t tiles = (inner + tile_columns - 1) / tile_columns;
  const int64_t o = blockIdx.x / tiles;
  const int64_t tile_start = (blockIdx.x % tiles) * tile_columns;
  const int64_t column = tile_start + tx * kVec;
  const int64_t segment = blockIdx.y;
  const int64_t begin = segment * chunk;
  const int64_t end = begin + chunk < len ? begin + chunk : len;

  Acc acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = Op::identity();
  if (column < inner) {
    const auto* packs = reinterpret_cast<const Pack*>(x + o * len * inner + column);
    const int64_t row_stride = inner / kVec;
    int64_t base = begin + ty;
    if constexpr (FoldsLater<Op, In>::value) {
      // The rows come in order: after a thread's first row, the rest fold
      // as later ones, with no tie of indices to break (argmax: two compares
      // and the selects an element, not the whole combine; bf16 (65536, 768)
      // dim 0 on the H200 49.4 -> 40.4 µs; a test for the identity in every
      // fold instead left 1 µs of that).
      if (base < end) {
        const Pack v = packs[base * row_stride];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = op.fold(acc[k], v.elem[k], base);
      }
      base += lanes;
    }
    for (; base < end; base += kUnroll * lanes) {
      Pack v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * lanes < end) v[u] = packs[(base + u * lanes) * row_stride];
      if constexpr (FoldsPacks<Op, In, kUnroll>::value) {
        if (base + (kUnroll - 1) * lanes < end) {
          // A full round of an op that folds packs: each column's kUnroll
          // rows join its accumulator at once (one Welford division, not
          // four).
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            VecN<In, kUnroll> rows;
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) rows.elem[u] = v[u].elem[k];
            acc[k] = op.fold_pack(acc[k], rows.elem, base);
          }
          continue;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * lanes < end) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[k] = fold_later(op, acc[k], v[u].elem[k], base + u * lanes);
        }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) partial[ty * pitch + tx * kVec + k] = acc[k];
  __syncthreads();
  // The tree, one accumulator per thread and step (few registers; every
  // thread busy however narrow the tile). tile_columns is a power of two.
  const int column_bits = __ffs(tile_columns) - 1;
  for (int half = lanes / 2; half > 0; half /= 2) {
    for (int i = threadIdx.x; i < half * tile_columns; i += kThreads) {
      Acc* const p = partial + (i >> column_bits) * pitch + (i & (tile_columns - 1));
      *p = Op::combine(*p, p[half * pitch]);
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < tile_columns && tile_start + c < inner; c += kThreads)
    store_result<kFinal>(op, out, (o * splits + segment) * inner + tile_start + c, partial[c]);
}

}  // namespace fastreduce
