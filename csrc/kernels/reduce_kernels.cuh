// The reduction kernels behind torch.ops.fastreduce.{sum,mean,prod,amax,amin}.
//
// Every problem is a view (outer, len, inner) of a dense buffer, reduced over
// `len`. Large reductions are decomposed into two passes (CUB's shape): pass 1
// folds fixed slices into accumulator partials, pass 2 folds the partials and
// finalizes. Slicing depends only on the shape and the SM count, never on
// timing, so results are bitwise reproducible and no atomics are needed.
#pragma once

#include "block_reduce.cuh"

namespace fastreduce {

template <typename Op, typename Out, bool kFinal>
__device__ __forceinline__ void store_result(Out* out, int64_t index, typename Op::acc_t acc,
                                             typename Op::acc_t scale) {
  out[index] = kFinal ? static_cast<Out>(Op::finalize(acc, scale)) : static_cast<Out>(acc);
}

// Full reduction of x[0, n): each block writes out[blockIdx.x]. With one block
// and kFinal this is the whole reduction; otherwise it is pass 1 and
// `out` holds accumulator partials for a one-block pass 2 over them.
template <typename Op, typename In, typename Out, bool kFinal>
__global__ void reduce_all_kernel(const In* __restrict__ x, int64_t n, Out* __restrict__ out,
                                  typename Op::acc_t scale) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  const int64_t rank = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t team = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Acc acc = strided_reduce<Op>(x, n, rank, team, Op::identity());
  acc = block_allreduce<Op>(acc, scratch);
  if (threadIdx.x == 0) store_result<Op, Out, kFinal>(out, blockIdx.x, acc, scale);
}

// Rows of a (rows, row_len) matrix, each cut into `splits` segments of `chunk`
// elements. A segment is reduced by one warp (short rows) or one block, and
// writes out[row * splits + segment].
template <typename Op, typename In, typename Out, bool kFinal, bool kWarpPerSegment>
__global__ void reduce_rows_kernel(const In* __restrict__ x, int64_t rows, int64_t row_len,
                                   int64_t splits, int64_t chunk, Out* __restrict__ out,
                                   typename Op::acc_t scale) {
  using Acc = typename Op::acc_t;
  __shared__ Acc scratch[kWarpSize];
  const int64_t segment = kWarpPerSegment ? static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) +
                                                threadIdx.x / kWarpSize
                                          : blockIdx.x;
  if (segment >= rows * splits) return;  // whole warps only: no barrier follows in that case
  const int64_t rank = kWarpPerSegment ? threadIdx.x % kWarpSize : threadIdx.x;
  const int64_t team = kWarpPerSegment ? kWarpSize : blockDim.x;
  const int64_t row = segment / splits;
  const int64_t start = (segment % splits) * chunk;
  const int64_t length = start + chunk < row_len ? chunk : row_len - start;
  Acc acc = strided_reduce<Op>(x + row * row_len + start, length, rank, team, Op::identity());
  acc = kWarpPerSegment ? warp_allreduce<Op>(acc) : block_allreduce<Op>(acc, scratch);
  if (rank == 0) store_result<Op, Out, kFinal>(out, segment, acc, scale);
}

constexpr int kColumnTile = 32;    // columns per block: one warp-wide coalesced row
constexpr int kColumnLanes = 8;    // rows a block walks at once
constexpr int kColumnThreads = kColumnTile * kColumnLanes;

// Columns of an (outer, len, inner) view: out[(o * splits + s) * inner + i] folds
// x[o, r, i] for r in segment s. blockIdx.x enumerates (o, column tile),
// blockIdx.y the segment. Threads of a warp read consecutive columns.
template <typename Op, typename In, typename Out, bool kFinal>
__global__ void __launch_bounds__(kColumnThreads)
    reduce_columns_kernel(const In* __restrict__ x, int64_t len, int64_t inner, int64_t splits,
                          int64_t chunk, Out* __restrict__ out, typename Op::acc_t scale) {
  using Acc = typename Op::acc_t;
  __shared__ Acc partial[kColumnLanes][kColumnTile + 1];
  const int tx = threadIdx.x % kColumnTile;
  const int ty = threadIdx.x / kColumnTile;
  const int64_t tiles = (inner + kColumnTile - 1) / kColumnTile;
  const int64_t o = blockIdx.x / tiles;
  const int64_t column = (blockIdx.x % tiles) * kColumnTile + tx;
  const int64_t segment = blockIdx.y;
  const int64_t begin = segment * chunk;
  const int64_t end = begin + chunk < len ? begin + chunk : len;

  Acc acc = Op::identity();
  if (column < inner) {
    const In* p = x + o * len * inner + column;
    constexpr int kUnroll = 4;
    int64_t r = begin + ty;
    for (; r + (kUnroll - 1) * kColumnLanes < end; r += kUnroll * kColumnLanes) {
      In v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = p[(r + u * kColumnLanes) * inner];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc = Op::combine(acc, static_cast<Acc>(v[u]));
    }
    for (; r < end; r += kColumnLanes) acc = Op::combine(acc, static_cast<Acc>(p[r * inner]));
  }
  partial[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && column < inner) {
#pragma unroll
    for (int k = 1; k < kColumnLanes; ++k) acc = Op::combine(acc, partial[k][tx]);
    store_result<Op, Out, kFinal>(out, (o * splits + segment) * inner + column, acc, scale);
  }
}

}  // namespace fastreduce
