#include "cross_entropy.h"

#include <algorithm>

#include "../kernels/cross_entropy_kernels.cuh"
#include "arrival_counters.h"
#include "rows.h"

namespace fastreduce {
namespace {

using namespace rows;

// The with-gradient kernel's blocks per SM, at most.
constexpr int kRowsPerSmMax = 32;
// The with-gradient kernel's static shared memory (its scratch, the block
// merge's and the cluster inboxes), at most.
constexpr int64_t kWithGradStaticBytes = 2048;
// The with-gradient kernel's rows split over a cluster: rows longer than
// this, in blocks of kSplitThreads.
constexpr int64_t kSplitRowBytes = 32 * 1024;
constexpr int kSplitThreads = 256;

// Bytes of the accumulator type (float, double for double).
size_t acc_bytes(const CrossEntropyShape& shape) { return shape.dtype == DType::Double ? 8 : 4; }

// Threads per row: enough for a few packs each, kCrossEntropyThreads at most.
int cross_entropy_threads(int64_t groups) {
  int threads = kWarpSize;
  while (threads < kCrossEntropyThreads && threads * int64_t(4) < groups) threads *= 2;
  return threads;
}

// `packs`: whole packs a row (CrossEntropyArgs); 0 for kernels that read no row.
template <typename T>
CrossEntropyArgs<T> kernel_args(const CrossEntropyShape& shape, const void* logits, const int64_t* target,
                                int64_t packs = 0) {
  return {static_cast<const T*>(logits), target, shape.rows, shape.classes, shape.row_stride, shape.ignore_index,
          static_cast<opmath_t<T>>(shape.label_smoothing), packs};
}

// Calls f(RowVec, packs): 16-byte packs where the buffers' rows start
// equally far from a 16-byte boundary (loose rows: each row's loose classes
// around them; whole rows: every row starts on one and is whole packs), else
// single classes.
template <typename T, typename F>
cudaError_t with_row_packs(const CrossEntropyShape& shape, std::initializer_list<const void*> buffers, F&& f) {
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t classes = shape.classes;
  if (packable<T>(shape.row_stride, buffers) && classes % kVec == 0) return f(RowVec<kVec>{}, classes / kVec);
  if (same_pack_offset(buffers) && classes >= kVec)
    return f(RowVec<kVec, true>{}, loose_row_packs<kVec>(classes));
  return f(RowVec<1>{}, classes);
}

}  // namespace

size_t cross_entropy_workspace_bytes(const CrossEntropyShape& shape) {
  return std::max<int64_t>(shape.rows, 1) * acc_bytes(shape);
}

cudaError_t cross_entropy_forward(const CrossEntropyShape& shape, const CrossEntropyForwardBuffers& io,
                                  void* workspace, cudaStream_t stream) {
  const void* logits = io.logits;
  const int64_t* target = io.target;
  void *loss = io.loss, *lse = io.lse;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target);
    auto* row_loss = static_cast<A*>(workspace);
    if (shape.rows > 0) {
      const cudaError_t err = with_row_packs<T>(shape, {logits}, [&](auto vec, int64_t packs) {
        constexpr int kVec = decltype(vec)::value;
        cross_entropy_forward_kernel<T, kVec><<<shape.rows, cross_entropy_threads(packs), 0, stream>>>(
            kernel_args<T>(shape, logits, target, packs), static_cast<A*>(lse), row_loss);
        return cudaGetLastError();
      });
      if (err != cudaSuccess) return err;
    }
    const auto reduction = static_cast<LossReduction>(shape.reduction);
    const int64_t blocks = reduction == LossReduction::None ? std::clamp<int64_t>(ceil_div(shape.rows, 1024), 1, 1024) : 1;
    cross_entropy_reduce_kernel<T><<<blocks, 1024, 0, stream>>>(a, row_loss, reduction, static_cast<T*>(loss));
    return cudaGetLastError();
  });
}

cudaError_t cross_entropy_backward(const CrossEntropyShape& shape, const CrossEntropyBackwardBuffers& io,
                                   void* workspace, cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  const void *grad_loss = io.grad_loss, *grad_lse = io.grad_lse, *logits = io.logits, *lse = io.lse;
  const int64_t* target = io.target;
  void* grad_input = io.grad_input;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target);
    const auto reduction = static_cast<LossReduction>(shape.reduction);
    auto* scale = static_cast<A*>(workspace);
    const bool per_row = reduction == LossReduction::None;
    if (!per_row) {
      cross_entropy_grad_scale_kernel<T><<<1, 1024, 0, stream>>>(a, static_cast<const T*>(grad_loss), reduction, scale);
      if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    }
    return with_row_packs<T>(shape, {logits, grad_input}, [&](auto vec, int64_t packs) {
      constexpr int kVec = decltype(vec)::value;
      cross_entropy_backward_kernel<T, kVec><<<shape.rows, cross_entropy_threads(packs), 0, stream>>>(
          kernel_args<T>(shape, logits, target, packs), per_row ? static_cast<const T*>(grad_loss) : nullptr, scale,
          static_cast<const A*>(grad_lse), static_cast<const A*>(lse), static_cast<T*>(grad_input));
      return cudaGetLastError();
    });
  });
}

size_t cross_entropy_forward_backward_workspace_bytes(const CrossEntropyShape& shape,
                                                     const CrossEntropyWithGradBuffers& io, int sm_count) {
  if (io.loss == nullptr) return 0;
  return size_t(sm_count) * kRowsPerSmMax * acc_bytes(shape) + sizeof(unsigned int);
}

cudaError_t cross_entropy_forward_backward(const CrossEntropyShape& shape, const CrossEntropyWithGradBuffers& io,
                                           void* workspace, int sm_count, cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  const void *logits = io.logits, *grad_scale = io.grad_scale;
  const int64_t* target = io.target;
  void *lse = io.lse, *row_loss = io.row_loss, *grad_input = io.grad_input;
  const bool mean = static_cast<LossReduction>(shape.reduction) == LossReduction::Mean;
  DeviceLimits limits;
  if (const cudaError_t err = device_limits(limits); err != cudaSuccess) return err;
  const int per_sm_bytes = limits.shared_per_sm, per_block_bytes = limits.shared_per_block;
  // The loss's fold: block sums at the start of the workspace, its counter
  // from the pool (or zeroed after the sums).
  unsigned int* arrivals = nullptr;
  if (io.loss) {
    arrivals = arrival_counters(stream, 1);
    if (arrivals == nullptr) {
      const size_t bytes = cross_entropy_forward_backward_workspace_bytes(shape, io, sm_count);
      arrivals = reinterpret_cast<unsigned int*>(static_cast<char*>(workspace) + bytes) - 1;
      if (const cudaError_t err = cudaMemsetAsync(arrivals, 0, sizeof(unsigned int), stream); err != cudaSuccess)
        return err;
    }
  }
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const LossFold<T> fold{static_cast<T*>(io.loss), static_cast<A*>(workspace), arrivals};
    return with_row_packs<T>(shape, {logits, grad_input}, [&](auto vec, int64_t packs) {
      constexpr int kVec = decltype(vec)::value;
      const CrossEntropyArgs<T> a = kernel_args<T>(shape, logits, target, packs);
      // Rows past one block's registers: the pipelined kernel, in the blocks
      // that the pipelined softmax takes (launch_pipelined_rows). H200,
      // bench/micro's cross_entropy and pipelined_blocks probes, a mean, µs,
      // the kernels below -> pipelined: bf16 (4096, 128256) 638 -> 536, (8192,
      // 50304) 484 -> 448, (1024, 262144) 343 -> 273, (8192, 32000) 343 ->
      // 274, (4096, 151936) 828 -> 724, (8192, 20480) 260 -> 198, (4096,
      // 200064) 1080 -> 922, (1024, 524288) 747 -> 558; float32 (4096,
      // 128256) 1154 -> 1045, (8192, 50304) 900 -> 845, (2048, 262144) 1236
      // -> 1063. (The pipelined softmax over the bytes of the first five:
      // 528, 427, 269, 264, 641.)
      if constexpr (std::is_same_v<A, float> && kVec > 1) {
        constexpr bool kLoose = decltype(vec)::loose;
        if (const auto launched = launch_pipelined_rows<T>(
                packs, shape.rows, 0, stream,
                std::make_tuple(a, static_cast<const A*>(grad_scale), mean, static_cast<A*>(lse),
                                static_cast<A*>(row_loss), fold, static_cast<T*>(grad_input)),
                [](auto pipelined_packs) {
                  return cross_entropy_forward_backward_pipelined_kernel<T, decltype(pipelined_packs)::value, kLoose>;
                }))
          return *launched;
      }
      const auto kernel = cross_entropy_forward_backward_kernel<T, kVec, false>;
      // Rows that fit twice per SM run in blocks of at most 512 threads, two
      // or more per SM, each row wholly in shared memory. Longer rows run one
      // block of 1024 threads per SM with as much of the row as fits (the
      // rest stays in L2): more rows in flight would overflow L2. Rows that
      // are not 16-byte packs are not cached.
      const int64_t row_bytes = sizeof(VecN<T, kVec>) == 16 ? packs * 16 : 0;
      const int64_t slot = row_bytes + kWithGradStaticBytes;
      const auto launch = [&](auto which, int64_t blocks, int threads, int64_t cached, bool prefetch, int cluster) {
        cudaLaunchAttribute attribute = cluster_attribute(cluster);
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(unsigned(blocks));
        config.blockDim = dim3(unsigned(threads));
        config.dynamicSmemBytes = size_t(cached) * 16;
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = cluster > 1 ? 1 : 0;
        return cudaLaunchKernelEx(&config, which, a, static_cast<const A*>(grad_scale), mean, static_cast<A*>(lse),
                                  static_cast<A*>(row_loss), fold, static_cast<T*>(grad_input), cached, prefetch);
      };
      // Rows past kSplitRowBytes that the pipelined kernel leaves (float rows
      // up to 16384 or past 262144, two-byte rows past 524288) run split over
      // the cluster (2 to 16 blocks of 256 threads, each caching its share
      // whole, two or more to an SM) of which most run at once, the smaller
      // on ties (float accumulators): more, shorter rows in flight. Not where
      // that keeps fewer rows in flight than half the SMs while one block
      // would cache most of the row.
      // H200, bench/micro's cross_entropy probe, µs unsplit (or split in 512
      // threads) -> split: bf16 (8192, 20480) 257 -> 244 (2 blocks), (8192,
      // 32000) 355 -> 325 (2), (8192, 50304) 487 -> 469 (2), (4096, 128256)
      // 658 -> 631 (4), (1024, 262144) 409 -> 344 (8); float32 (8192, 50304)
      // 967 -> 877 (2), (4096, 128256) 1374 -> 1139 (8), (4096, 151936)
      // 1567 -> 1463 (8). Left whole: bf16 (4096, 151936) 805 (849 split over
      // 4 or 8, 62 clusters at once), (4096, 200064) 1057 (1043).
      if constexpr (std::is_same_v<A, float> && sizeof(VecN<T, kVec>) == 16) {
        if (row_bytes > kSplitRowBytes && cluster_launch_supported()) {
          const auto split = cross_entropy_forward_backward_kernel<T, kVec, true>;
          int best = 0, best_resident = 0;
          for (int cluster = 2; cluster <= kClusterBlocksMax; cluster *= 2) {
            const int64_t share_bytes = ceil_div(packs, int64_t(cluster)) * 16;
            if (2 * (share_bytes + kWithGradStaticBytes) > per_sm_bytes) continue;
            const int resident = resident_clusters(split, cluster, kSplitThreads, size_t(share_bytes));
            if (resident > best_resident) best = cluster, best_resident = resident;
          }
          const bool mostly_cached = row_bytes <= 2 * (per_block_bytes - kWithGradStaticBytes);
          if (best > 0 && (2 * best_resident >= sm_count || !mostly_cached)) {
            const int64_t share = ceil_div(packs, int64_t(best));
            if (const cudaError_t err = allow_clusters(split, best, size_t(share) * 16); err != cudaSuccess)
              return err;
            return launch(split, std::min<int64_t>(shape.rows, best_resident) * best, kSplitThreads, share,
                          /*prefetch=*/true, best);
          }
        }
      }
      int threads = kCrossEntropyResidentThreads, per_sm = 1;
      int64_t cached = std::min<int64_t>(row_bytes, per_block_bytes - kWithGradStaticBytes) / 16;
      if (2 * slot <= per_sm_bytes) {
        threads = kWarpSize;
        while (threads < kCrossEntropyResidentThreads / 2 && threads * int64_t(4) < packs) threads *= 2;
        per_sm = int(std::min<int64_t>({per_sm_bytes / slot, 2048 / threads, kRowsPerSmMax}));
        cached = row_bytes / 16;
      }
      // Prefetching the next row into the slots as they free (H100, bench/micro's cross_entropy probe): 1-6%
      // faster where two rows fit an SM or a quarter of the row or more is left to L2; 0.4-2% slower where one
      // block caches more (bf16 (4096, 128256), float32 (8192, 50304)).
      const bool prefetch = per_sm > 1 || 4 * (packs - cached) >= packs;
      if (const cudaError_t err = allow_shared_bytes(kernel, size_t(cached) * 16); err != cudaSuccess) return err;
      return launch(kernel, std::min<int64_t>(shape.rows, int64_t(sm_count) * per_sm), threads, cached, prefetch, 1);
    });
  });
}

}  // namespace fastreduce
