#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../kernels/softmax_kernels.cuh"
#include "rows.h"
#include "softmax.h"

namespace fastreduce {

using namespace rows;

namespace {

// The register kernels of causal or plain rows (plain rows skip the
// per-element checks), `Vec` a RowVec: loose rows are plain ones.
template <typename T, int kPacks, typename Vec, bool kWarpRows, bool kWalk = false>
auto forward_lanes(int64_t causal) {
  return causal ? softmax_forward_lanes_kernel<T, kPacks, Vec::value, kWarpRows, true, kWalk>
                : softmax_forward_lanes_kernel<T, kPacks, Vec::value, kWarpRows, false, kWalk, Vec::loose>;
}
template <typename T, int kPacks, typename Vec, bool kWarpRows>
auto backward_lanes(int64_t causal) {
  return causal ? softmax_backward_lanes_kernel<T, kPacks, Vec::value, kWarpRows, true>
                : softmax_backward_lanes_kernel<T, kPacks, Vec::value, kWarpRows, false, Vec::loose>;
}

// Block and cluster rows: plain rows that are not whole packs read as loose
// rows (PackedRow); causal rows as packs or element by element.
template <typename T, Walks kWalks = Walks::kNone, typename KernelFor, typename Args, typename Fallback>
cudaError_t launch_softmax_lanes(int64_t causal, int64_t rows, int64_t n, std::initializer_list<const void*> buffers,
                                 cudaStream_t stream, KernelFor&& kernel_for, const Args& args, Fallback&& fallback) {
  return causal ? launch_block_lanes<T, 8, kWalks, false>(rows, 0, n, buffers, stream, kernel_for, args, fallback)
                : launch_block_lanes<T, 8, kWalks, true>(rows, 0, n, buffers, stream, kernel_for, args, fallback);
}

// The backward of two-byte plain rows past one block: the pipelined kernel
// at four packs of y and dy a thread, in the smallest cluster of 256-thread
// blocks that holds the row, or of 16 blocks of 512 threads (262144 bf16:
// 201.2 µs against the lanes kernel's 264.8). {0, 0} where neither holds it.
constexpr int kBackwardPipelinedPacks = 4;
template <typename T>
PipelinedBlocks backward_pipelined_blocks(int64_t n, std::initializer_list<const void*> buffers) {
  if constexpr (sizeof(T) == 2) {
    const int64_t groups = pipelined_groups<T, true>(n, buffers);
    for (int threads : {kPipelinedThreads, kRowThreadsMax})
      if (const int cluster = smallest_pipelined_cluster<T>(groups, threads, kBackwardPipelinedPacks))
        return {threads, cluster};
  }
  return {0, 0};
}

}  // namespace

cudaError_t softmax_forward(const SoftmaxShape& shape, const SoftmaxForwardBuffers& io, cudaStream_t stream) {
  // Locals, not structured bindings: C++17 lambdas cannot capture those.
  const int64_t rows = shape.rows, n = shape.n, causal = shape.causal;
  const double scale = shape.scale;
  const void* x = io.x;
  void* y = io.y;
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(x), static_cast<T*>(y));
    const auto row_args =
        std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), causal, static_cast<A>(scale)));
    const auto plain_args = std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), static_cast<A>(scale)));
    if constexpr (sizeof(T) <= 4)
      if (!causal && takes_short_rows<T>(n, {x, y}))
        return with_short_row_lanes<T>(n, [&](auto lanes) {
          constexpr int kLanes = decltype(lanes)::value;
          return launch_short_rows(softmax_forward_short_rows_kernel<T, kLanes>, rows, kShortRowsPerWarp<kLanes>,
                                   stream, plain_args);
        });
    if (n <= kWarpRowMax && causal)
      return with_vec<T>(n, {x, y}, [&](auto vec) {
        return launch_staged_rows(softmax_causal_warp_kernel<T, decltype(vec)::value>, rows, n, sizeof(T), stream,
                                  row_args);
      });
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {x, y}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        return launch_warp_rows(softmax_forward_lanes_kernel<T, decltype(per_lane)::value / kVec, kVec, true, false>,
                                rows, stream, row_args);
      });
    // Plain two-byte rows of 16385-32768: one block a row of up to
    // kWideRowThreads threads, four packs each (as the norm forward's).
    // H100, bf16 (4096, 32768), kernel µs in bench/peers.py: clusters 185.7
    // -> one block 175.2 (the copy 172.8). Float rows stay on clusters: this
    // kernel at eight float packs spills (670 bytes).
    if constexpr (sizeof(T) == 2)
      if (const int threads = wide_row_threads<T>(n); threads && !causal && packable<T>(n, {x, y})) {
        const auto kernel = softmax_forward_lanes_kernel<T, kWideRowPacks<T>, Vec16<T>::kSize, false, false, false,
                                                         false, kWideRowThreads>;
        std::apply([&](auto... a) { kernel<<<rows, threads, 0, stream>>>(a...); }, row_args);
        return cudaGetLastError();
      }
    // Plain rows past one block: the pipelined kernel (rows.h). H200, µs,
    // against the four-pack kernel: bf16 (512, 262144) 175.6 -> 148.8,
    // (1024, 131072) 163.7 -> 140.9, (4096, 32768) 145.6 -> 139.2 (before
    // the one-block rows above took it); float32
    // (512, 131072) 152.5 -> 134.7, (2048, 32768) 137.9 -> 133.3. Loose rows
    // too: bf16 (8192, 50257) 517 -> 482 (436 at 50304), float32 854 (839).
    // Their blocks: launch_pipelined_rows.
    if constexpr (sizeof(T) <= 4)
      if (!causal) {
        const bool whole = packable<T>(n, {x, y});
        if (const auto launched = launch_pipelined_rows<T, /*kWideAtEightPacks=*/true, FewerPacks::kWhereMoreResident>(
                pipelined_groups<T, true>(n, {x, y}), rows, 0, stream, plain_args, [whole](auto packs) {
                  constexpr int kPacks = decltype(packs)::value;
                  return whole ? softmax_forward_pipelined_kernel<T, kPacks, false>
                               : softmax_forward_pipelined_kernel<T, kPacks, true>;
                }))
          return *launched;
      }
    // The other two-byte rows in clusters (causal, or past 262144) walk
    // where as many clusters stay resident (plain bf16 rows on the H100,
    // before the pipelined kernel: (512, 262144) 226 -> 213 µs, (1024,
    // 131072) 208 -> 199); float rows lost walking (131072 wide: 355 -> 385).
    constexpr Walks kWalks = sizeof(T) == 2 ? Walks::kWhereResident : Walks::kNone;
    return launch_softmax_lanes<T, kWalks>(
        causal, rows, n, {x, y}, stream,
        [&](auto packs, auto vec, auto... walk) {
          constexpr bool kWalk = (false || ... || decltype(walk)::value);
          return forward_lanes<T, decltype(packs)::value, decltype(vec), false, kWalk>(causal);
        },
        row_args, [&] {
          return launch_block_rows(softmax_forward_kernel<T>, 1, sizeof(A), rows, n, stream,
                                   std::tuple_cat(args, std::make_tuple(n, causal, static_cast<A>(scale))));
        });
  });
}

cudaError_t softmax_backward(const SoftmaxShape& shape, const SoftmaxBackwardBuffers& io, cudaStream_t stream) {
  const int64_t rows = shape.rows, n = shape.n, causal = shape.causal;
  const double scale = shape.scale;
  const void *dy = io.dy, *y = io.y;
  void* dx = io.dx;
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx));
    const auto row_args =
        std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), causal, static_cast<A>(scale)));
    const auto plain_args = std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), static_cast<A>(scale)));
    if constexpr (sizeof(T) <= 4)
      if (!causal && takes_short_rows<T>(n, {y, dy, dx}))
        return with_short_row_lanes<T>(n, [&](auto lanes) {
          constexpr int kLanes = decltype(lanes)::value;
          return launch_short_rows(softmax_backward_short_rows_kernel<T, kLanes>, rows, kShortRowsPerWarp<kLanes>,
                                   stream, plain_args);
        });
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {y, dy, dx}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        return launch_warp_rows(backward_lanes<T, decltype(per_lane)::value / kVec, RowVec<kVec>, true>(causal), rows,
                                stream, row_args);
      });
    if constexpr (sizeof(T) == 2)
      if (const PipelinedBlocks blocks = causal ? PipelinedBlocks{0, 0} : backward_pipelined_blocks<T>(n, {y, dy, dx});
          blocks.cluster) {
        const auto kernel = packable<T>(n, {y, dy, dx})
                                ? softmax_backward_pipelined_kernel<T, kBackwardPipelinedPacks, false>
                                : softmax_backward_pipelined_kernel<T, kBackwardPipelinedPacks, true>;
        if (const auto launched =
                launch_pipelined(kernel, rows, blocks.cluster, 0, stream, plain_args, blocks.threads))
          return *launched;
      }
    return launch_softmax_lanes<T>(
        causal, rows, n, {y, dy, dx}, stream,
        [&](auto packs, auto vec) { return backward_lanes<T, decltype(packs)::value, decltype(vec), false>(causal); },
        row_args, [&] {
          return launch_block_rows(softmax_backward_kernel<T>, 2, sizeof(A), rows, n, stream,
                                   std::tuple_cat(args, std::make_tuple(n, causal, static_cast<A>(scale))));
        });
  });
}

}  // namespace fastreduce
