// The reduction kernels behind every op of the reduction family (sum, mean,
// prod, amax, amin, var/std, logsumexp, norm, argmax/argmin, aminmax,
// any/all): each kernel is generic over an op (reduce_op.h's contract) and
// a sink that the op stores its results to.
//
// Every problem is a view (outer, len, inner) of a dense buffer, reduced over
// `len`. Large reductions are decomposed into two passes (CUB's shape): pass 1
// folds fixed slices into accumulator partials, pass 2 folds the partials and
// finalizes. Slicing depends only on the shape and the SM count, never on
// timing, so results are bitwise reproducible. Rows and columns run pass 2 as
// a programmatic dependent of pass 1 (every such kernel opens with
// begin_pass<kFinal>()); a full reduction runs both in one launch.
#pragma once

#include "block_reduce.cuh"
#include "dependent_launch.cuh"

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

// A value that another block of this launch wrote, read from L2 (L1 is not
// coherent across SMs).
template <typename T>
__device__ __forceinline__ T load_from_other_block(const T* p) {
  static_assert(sizeof(T) % sizeof(unsigned int) == 0, "accumulators are whole 32-bit words");
  T value;
  auto* words = reinterpret_cast<unsigned int*>(&value);
#pragma unroll
  for (int k = 0; k < int(sizeof(T) / sizeof(unsigned int)); ++k)
    words[k] = __ldcg(reinterpret_cast<const unsigned int*>(p) + k);
  return value;
}

// x[0, n) in one launch of a grid of blocks (CUB's two passes, the second
// folded into the first): each block folds its share into
// partials[blockIdx.x]; the last block to finish, found by counting arrivals,
// folds the partials in index order, stores the result and sets the counter
// back to zero for the next launch. Which block comes last varies; the
// partials and their fold do not: bitwise reproducible.
template <typename Op, typename In, typename Sink>
__global__ void __launch_bounds__(kAllThreads, kAllMinBlocks<Op>)
    reduce_all_grid_kernel(const In* __restrict__ x, int64_t n, typename Op::acc_t* partials,
                           unsigned int* arrivals, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  __shared__ bool last;
  const int64_t rank = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t team = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Acc acc = strided_reduce<Op>(x, n, rank, team, Op::identity(), op);
  acc = block_allreduce<Op>(acc, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    __threadfence();  // the partial is visible device-wide before the block counts itself in
    last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
    __threadfence();  // and the last block's reads come after every count
  }
  __syncthreads();
  if (!last) return;
  Acc total = Op::identity();
  for (unsigned int i = threadIdx.x; i < gridDim.x; i += blockDim.x)
    total = Op::combine(total, load_from_other_block(partials + i));
  total = block_allreduce<Op>(total, scratch);
  if (threadIdx.x == 0) {
    op.store(out, 0, total);
    *arrivals = 0;
  }
}

// Rows of a (rows, row_len) matrix, each cut into `splits` segments of `chunk`
// elements. A segment is reduced by a team of kTeam lanes (short rows; a power
// of two up to 32) or, with kTeam == 0, by the whole block, and writes
// out[row * splits + segment].
template <typename Op, typename In, typename Sink, bool kFinal, int kTeam>
__global__ void reduce_rows_kernel(const In* __restrict__ x, int64_t rows, int64_t row_len,
                                   int64_t splits, int64_t chunk, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  constexpr bool kWholeBlock = kTeam == 0;
  __shared__ Acc scratch[kWarpSize];
  begin_pass<kFinal>();
  const int64_t segment =
      kWholeBlock ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * (blockDim.x / kTeam) + threadIdx.x / kTeam;
  // Lanes past the last segment still join the shuffles, with nothing to read.
  const bool valid = segment < rows * splits;
  const int64_t rank = kWholeBlock ? threadIdx.x : threadIdx.x % kTeam;
  const int64_t team = kWholeBlock ? blockDim.x : kTeam;
  const int64_t row = segment / splits;
  const int64_t start = (segment % splits) * chunk;
  const int64_t length = !valid ? 0 : start + chunk < row_len ? chunk : row_len - start;
  Acc acc = strided_reduce<Op>(x + (valid ? row * row_len + start : 0), length, rank, team, Op::identity(), op,
                               start);
  if constexpr (kWholeBlock) acc = block_allreduce<Op>(acc, scratch);
  else acc = warp_allreduce<Op, kTeam>(acc);
  if (valid && rank == 0) store_result<kFinal>(op, out, segment, acc);
}

constexpr int kColumnTile = 32;    // threads across the columns of a tile: one warp
constexpr int kColumnLanes = 8;    // rows a block walks at once
constexpr int kColumnThreads = kColumnTile * kColumnLanes;
// The second pass walks the partials of a tall column (hundreds of segments)
// with 32 rows at once: latency, not bandwidth, bounds it.
constexpr int kFinishColumnLanes = 32;

// Columns of an (outer, len, inner) view: out[(o * splits + s) * inner + i] folds
// x[o, r, i] for r in segment s. blockIdx.x enumerates (o, column tile),
// blockIdx.y the segment. Each thread owns kVec adjacent columns and loads
// them as one vector (kVec > 1 needs inner % kVec == 0 and an aligned x), so a
// warp reads 32 * kVec consecutive elements of a row; kLanes warps walk the
// rows.
template <typename Op, typename In, typename Sink, bool kFinal, int kVec, int kLanes = kColumnLanes>
__global__ void __launch_bounds__(kColumnTile * kLanes)
    reduce_columns_kernel(const In* __restrict__ x, int64_t len, int64_t inner, int64_t splits,
                          int64_t chunk, Sink out, Op op) {
  using Acc = typename Op::acc_t;
  using Pack = VecN<In, kVec>;
  constexpr int kTileColumns = kColumnTile * kVec;
  constexpr int kUnroll = 4;
  __shared__ Acc partial[kLanes][kTileColumns + 1];
  begin_pass<kFinal>();
  const int tx = threadIdx.x % kColumnTile;
  const int ty = threadIdx.x / kColumnTile;
  const int64_t tiles = (inner + kTileColumns - 1) / kTileColumns;
  const int64_t o = blockIdx.x / tiles;
  const int64_t tile_start = (blockIdx.x % tiles) * kTileColumns;
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
    for (int64_t base = begin + ty; base < end; base += kUnroll * kLanes) {
      Pack v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * kLanes < end) v[u] = packs[(base + u * kLanes) * row_stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * kLanes < end) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[k] = op.fold(acc[k], v[u].elem[k], base + u * kLanes);
        }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) partial[ty][tx * kVec + k] = acc[k];
  __syncthreads();
  for (int c = threadIdx.x; c < kTileColumns; c += kColumnTile * kLanes) {
    if (tile_start + c >= inner) break;
    Acc total = partial[0][c];
#pragma unroll
    for (int k = 1; k < kLanes; ++k) total = Op::combine(total, partial[k][c]);
    store_result<kFinal>(op, out, (o * splits + segment) * inner + tile_start + c, total);
  }
}

}  // namespace fastreduce
