#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../kernels/softmax_kernels.cuh"
#include "rows.h"
#include "softmax.h"

namespace fastreduce {

using namespace rows;

namespace {

// The register kernels of causal or plain rows (plain rows skip the
// per-element checks).
template <typename T, int kPacks, int kVec, bool kWarpRows, bool kWalk = false>
auto forward_lanes(int64_t causal) {
  return causal ? softmax_forward_lanes_kernel<T, kPacks, kVec, kWarpRows, true, kWalk>
                : softmax_forward_lanes_kernel<T, kPacks, kVec, kWarpRows, false, kWalk>;
}
template <typename T, int kPacks, int kVec, bool kWarpRows>
auto backward_lanes(int64_t causal) {
  return causal ? softmax_backward_lanes_kernel<T, kPacks, kVec, kWarpRows, true>
                : softmax_backward_lanes_kernel<T, kPacks, kVec, kWarpRows, false>;
}

// Plain rows past one block's registers (16384 bf16, 8192 floats) of
// 16-byte packs, where clusters exist: softmax_forward_pipelined_kernel at
// eight packs a thread, in the smallest cluster of 4 to 16 blocks of 256
// threads (two an SM) that holds the row; two-byte rows that 2 such blocks
// would hold take 4 of 128 threads. {0, 0} elsewhere: float rows of 16384
// ran faster unpipelined (H200: 129.4 against 133.2-140.1 µs), and rows
// past 16 blocks of 256 threads (float 262144: 144.3 against 150.9 in
// 512-thread blocks) keep the kernel above. A wave of resident clusters
// walks the rows.
constexpr int kPipelinedPacks = 8, kPipelinedThreads = 256;
struct PipelinedLanes {
  int threads, cluster;
};
template <typename T>
PipelinedLanes pipelined_lanes(int64_t groups) {
  const int64_t block = int64_t(kPipelinedThreads) * kPipelinedPacks;
  if (groups <= 2 * block) return sizeof(T) == 2 ? PipelinedLanes{kPipelinedThreads / 2, 4} : PipelinedLanes{0, 0};
  for (int cluster = 4; cluster <= kClusterBlocksMax; cluster *= 2)
    if (groups <= cluster * block) return {kPipelinedThreads, cluster};
  return {0, 0};
}

template <typename T>
cudaError_t launch_pipelined_rows(PipelinedLanes lanes, int64_t rows, cudaStream_t stream, const T* x, T* y, int n,
                                  opmath_t<T> scale) {
  const auto kernel = softmax_forward_pipelined_kernel<T, kPipelinedPacks>;
  const int resident = resident_clusters(kernel, lanes.cluster, lanes.threads, 0);
  const int64_t groups = resident > 0 ? std::min<int64_t>(rows, resident) : rows;
  return launch_clusters(kernel, groups, lanes.cluster, lanes.threads, 0, stream,
                         std::make_tuple(x, y, rows, n, scale));
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
    if constexpr (sizeof(T) <= 4) {
      constexpr int kVec = Vec16<T>::kSize;
      if (!causal && n > int64_t(kRowThreadsMax) * 4 * kVec && packable<T>(n, {x, y}) && cluster_launch_supported())
        if (const PipelinedLanes lanes = pipelined_lanes<T>(n / kVec); lanes.cluster)
          return launch_pipelined_rows<T>(lanes, rows, stream, static_cast<const T*>(x), static_cast<T*>(y),
                                          static_cast<int>(n), static_cast<A>(scale));
    }
    // The other two-byte rows in clusters (causal, or past 262144) walk
    // where as many clusters stay resident (plain bf16 rows on the H100,
    // before the pipelined kernel: (512, 262144) 226 -> 213 µs, (1024,
    // 131072) 208 -> 199); float rows lost walking (131072 wide: 355 -> 385).
    constexpr Walks kWalks = sizeof(T) == 2 ? Walks::kWhereResident : Walks::kNone;
    return launch_block_lanes<T, 8, kWalks>(
        rows, 0, n, {x, y}, stream,
        [&](auto packs, auto vec, auto... walk) {
          constexpr bool kWalk = (false || ... || decltype(walk)::value);
          return forward_lanes<T, decltype(packs)::value, decltype(vec)::value, false, kWalk>(causal);
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
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {y, dy, dx}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        return launch_warp_rows(backward_lanes<T, decltype(per_lane)::value / kVec, kVec, true>(causal), rows, stream,
                                row_args);
      });
    return launch_block_lanes<T, 8>(
        rows, 0, n, {y, dy, dx}, stream,
        [&](auto packs, auto vec) {
          return backward_lanes<T, decltype(packs)::value, decltype(vec)::value, false>(causal);
        },
        row_args, [&] {
          return launch_block_rows(softmax_backward_kernel<T>, 2, sizeof(A), rows, n, stream,
                                   std::tuple_cat(args, std::make_tuple(n, causal, static_cast<A>(scale))));
        });
  });
}

}  // namespace fastreduce
