// How the row kernels (row_io.cuh) are launched: the row shape picks warp
// or block rows, registers or shared memory, packs or elements. Shared by
// the norm, softmax and cross-entropy launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../kernels/ceil_div.h"
#include "../kernels/dtype.h"
#include "../kernels/row_io.cuh"
#include "device_limits.h"

namespace fastreduce {
namespace rows {

// About eight elements per thread, 32 to 1024 threads.
inline int row_threads(int64_t n) {
  int threads = 32;
  while (threads < 1024 && threads * 8 < n) threads *= 2;
  return threads;
}

// Room the row kernels' static shared scratch takes beside the dynamic bytes.
constexpr size_t kStaticSharedBytes = 1024;

// Raises `attribute` of `kernel` on the current device to at least `value`.
// Made once per kernel, attribute and device (a driver call per launch
// otherwise); a value only grows, so no launch finds it lowered by a smaller
// request after its own.
template <typename Kernel>
cudaError_t raise_attribute(Kernel kernel, cudaFuncAttribute attribute, int value) {
  struct Raised {
    const void* kernel;
    int device;
    cudaFuncAttribute attribute;
    int value;
  };
  static std::mutex mutex;
  static std::vector<Raised> raised;
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  const void* const key = reinterpret_cast<const void*>(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  auto entry = std::find_if(raised.begin(), raised.end(), [&](const Raised& r) {
    return r.kernel == key && r.device == device && r.attribute == attribute;
  });
  if (entry != raised.end() && entry->value >= value) return cudaSuccess;
  if (const cudaError_t err = cudaFuncSetAttribute(kernel, attribute, value); err != cudaSuccess) return err;
  if (entry != raised.end()) entry->value = value;
  else raised.push_back({key, device, attribute, value});
  return cudaSuccess;
}

// Lets `kernel` take `bytes` of dynamic shared memory on the current device,
// which beyond 48 KiB with its static scratch needs an opt-in.
template <typename Kernel>
cudaError_t allow_shared_bytes(Kernel kernel, size_t bytes) {
  if (bytes + kStaticSharedBytes <= 48 * 1024) return cudaSuccess;
  return raise_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

// `bytes` of dynamic shared memory for `kernel`, or 0 when they do not fit.
template <typename Kernel>
size_t fitting_shared_bytes(Kernel kernel, size_t bytes) {
  DeviceLimits limits;
  if (device_limits(limits) != cudaSuccess || bytes > size_t(limits.shared_per_block) - kStaticSharedBytes) return 0;
  return allow_shared_bytes(kernel, bytes) == cudaSuccess ? bytes : 0;
}

// Dynamic shared memory for `slots` rows of n elements of elem_size bytes, in
// the kernels' row_cache() layout, or 0 when they do not fit.
template <typename Kernel>
size_t cache_bytes(Kernel kernel, int slots, int64_t n, size_t elem_size) {
  return fitting_shared_bytes(kernel, slots * ((n * elem_size + 15) / 16 * 16));
}

// Rows up to this length run one warp each: staged in shared memory forward,
// in registers backward.
constexpr int64_t kWarpRowMax = 1024;

// Calls f(kPerLane, kVec) for the first count of kCounts whose kPerLane =
// kVec * count elements per lane cover n (counts beyond 32 elements are not
// compiled).
template <int kVec, int... kCounts, typename F>
cudaError_t with_count(int64_t n, std::integer_sequence<int, kCounts...>, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  auto try_count = [&](auto count) {
    constexpr int kPerLane = kVec * decltype(count)::value;
    if constexpr (kPerLane > kWarpSize) {
      return false;
    } else {
      if (int64_t(kWarpSize) * kPerLane < n) return false;
      result = f(std::integral_constant<int, kPerLane>{}, std::integral_constant<int, kVec>{});
      return true;
    }
  };
  (try_count(std::integral_constant<int, kCounts>{}) || ...);
  return result;
}

// Calls f(kCount) (an integral constant) for the one of kCounts equal to count.
template <int... kCounts, typename F>
cudaError_t with_exact_count(int64_t count, std::integer_sequence<int, kCounts...>, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  ((count == kCounts && (result = f(std::integral_constant<int, kCounts>{}), true)) || ...);
  return result;
}

template <int... kCounts>
constexpr bool is_one_of(int64_t count, std::integer_sequence<int, kCounts...>) {
  return ((count == kCounts) || ...);
}

// Whether every row of n elements of every buffer starts 16-byte aligned and
// n is a whole number of 16-byte packs (null buffers do not count).
template <typename T>
bool packable(int64_t n, std::initializer_list<const void*> buffers) {
  bool packed = n % Vec16<T>::kSize == 0;
  for (const void* buffer : buffers) packed = packed && reinterpret_cast<uintptr_t>(buffer) % 16 == 0;
  return packed;
}

// Calls f(kVec) as an integral constant: the 16-byte pack when packable, else 1.
template <typename T, typename F>
cudaError_t with_vec(int64_t n, std::initializer_list<const void*> buffers, F&& f) {
  if (packable<T>(n, buffers)) return f(std::integral_constant<int, Vec16<T>::kSize>{});
  return f(std::integral_constant<int, 1>{});
}

// Whether every buffer (null ones aside) starts equally far from a 16-byte
// boundary: then so does each row of theirs, row for row.
inline bool same_pack_offset(std::initializer_list<const void*> buffers) {
  int offset = -1;
  for (const void* buffer : buffers) {
    if (buffer == nullptr) continue;
    const int mine = static_cast<int>(reinterpret_cast<uintptr_t>(buffer) % 16);
    if (offset >= 0 && mine != offset) return false;
    offset = mine;
  }
  return true;
}

// A pack width (an integral constant) and whether rows of it are loose
// (row_io.cuh's PackedRow: not whole packs, or not starting on a 16-byte
// boundary).
template <int kVec, bool kLoose = false>
struct RowVec : std::integral_constant<int, kVec> {
  static constexpr bool loose = kLoose;
};

// Whole packs a row of n elements, of RowVec `Vec`.
template <typename Vec>
int64_t row_packs(int64_t n) {
  return Vec::loose ? loose_row_packs<Vec::value>(n) : n / Vec::value;
}

// Calls f(RowVec): as with_vec, except that rows which are not packable but
// start equally far from a 16-byte boundary in every buffer are loose rows
// of 16-byte packs where kLoose allows them (kernels that take PackedRow).
template <typename T, bool kLoose, typename F>
cudaError_t with_row_vec(int64_t n, std::initializer_list<const void*> buffers, F&& f) {
  constexpr int kVec = Vec16<T>::kSize;
  if (packable<T>(n, buffers)) return f(RowVec<kVec>{});
  if constexpr (kLoose && kVec > 1)
    if (n >= kVec && same_pack_offset(buffers)) return f(RowVec<kVec, true>{});
  return f(RowVec<1>{});
}

// Calls f(kPerLane, kVec) as integral constants, kVec as with_vec. kPerLane:
// packed, the fewest of 1, 2, 3, 4, 6, 8, ... packs per lane that cover n
// (768 floats: 6 packs, no idle registers); unpacked, a power of two.
template <typename T, typename F>
cudaError_t with_lanes(int64_t n, std::initializer_list<const void*> buffers, F&& f) {
  if (packable<T>(n, buffers))
    return with_count<Vec16<T>::kSize>(n, std::integer_sequence<int, 1, 2, 3, 4, 6, 8, 12, 16>{}, f);
  return with_count<1>(n, std::integer_sequence<int, 1, 2, 4, 8, 16, 32>{}, f);
}

// Rows of up to a 16-byte pack a lane (two-byte rows up to 256, float up to
// 128), 16-byte aligned: the short-row kernels, several rows a warp.
template <typename T>
bool takes_short_rows(int64_t n, std::initializer_list<const void*> buffers) {
  return sizeof(T) <= 4 && n <= int64_t(kWarpSize) * Vec16<T>::kSize && packable<T>(n, buffers);
}

// f(kLanes): the fewest lanes, a power of two, that hold a short row's packs.
template <typename T, typename F>
cudaError_t with_short_row_lanes(int64_t n, F&& f) {
  const int64_t groups = n / Vec16<T>::kSize;
  if (groups <= 1) return f(std::integral_constant<int, 1>{});
  if (groups <= 2) return f(std::integral_constant<int, 2>{});
  if (groups <= 4) return f(std::integral_constant<int, 4>{});
  if (groups <= 8) return f(std::integral_constant<int, 8>{});
  if (groups <= 16) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

inline int64_t warp_row_blocks(int64_t rows) { return ceil_div(rows, kWarpRowsPerBlock); }
constexpr int kWarpRowThreads = kWarpRowsPerBlock * kWarpSize;

// One warp per row (rows up to kWarpRowMax); `args` are the kernel's arguments.
template <typename Kernel, typename Args>
cudaError_t launch_warp_rows(Kernel kernel, int64_t rows, cudaStream_t stream, const Args& args,
                             int rows_per_block = kWarpRowsPerBlock, size_t shared_bytes = 0) {
  const int64_t blocks = ceil_div(rows, rows_per_block);
  std::apply([&](auto... a) { kernel<<<blocks, rows_per_block * kWarpSize, shared_bytes, stream>>>(a...); }, args);
  return cudaGetLastError();
}

// The short-row kernels: blocks of kShortRowWarps warps, each taking
// rows_per_warp rows.
template <typename Kernel, typename Args>
cudaError_t launch_short_rows(Kernel kernel, int64_t rows, int rows_per_warp, cudaStream_t stream, const Args& args) {
  const int64_t blocks = ceil_div(rows, int64_t(kShortRowWarps) * rows_per_warp);
  std::apply([&](auto... a) { kernel<<<blocks, kShortRowWarps * kWarpSize, 0, stream>>>(a...); }, args);
  return cudaGetLastError();
}

// One warp per row with the row staged in shared memory: a row_cache() slot
// of n elements per warp.
template <typename Kernel, typename Args>
cudaError_t launch_staged_rows(Kernel kernel, int64_t rows, int64_t n, size_t elem_size, cudaStream_t stream,
                               const Args& args) {
  const size_t bytes = cache_bytes(kernel, kWarpRowsPerBlock, n, elem_size);
  if (bytes == 0) return cudaErrorInvalidConfiguration;  // rows up to kWarpRowMax always fit
  std::apply([&](auto... a) { kernel<<<warp_row_blocks(rows), kWarpRowThreads, bytes, stream>>>(a...); }, args);
  return cudaGetLastError();
}

// Rows longer than kWarpRowMax with the row in registers, one block each:
// the fewest threads (a power of two) that hold the row's packs `packs` at
// most each, or 0 when that takes more than kRowThreadsMax.
inline int block_lane_threads(int64_t groups, int packs = 4) {
  int threads = kWarpSize;
  while (threads * int64_t(packs) < groups) threads *= 2;
  return threads <= kRowThreadsMax ? threads : 0;
}

// Calls f(kPacks, RowVec, threads) (the first an integral constant) for rows
// held in registers by a block each, or returns fallback() when the row does
// not fit. Rows beyond kWarpRowMax have over 128 packs, so 3 or 4 a thread.
template <typename T, bool kLoose, typename F, typename Fallback>
cudaError_t with_block_lanes(int64_t n, std::initializer_list<const void*> buffers, F&& f, Fallback&& fallback) {
  return with_row_vec<T, kLoose>(n, buffers, [&](auto vec) {
    const int64_t groups = row_packs<decltype(vec)>(n);
    const int threads = block_lane_threads(groups);
    if (threads == 0) return fallback();
    return ceil_div(groups, threads) <= 3 ? f(std::integral_constant<int, 3>{}, vec, threads)
                                          : f(std::integral_constant<int, 4>{}, vec, threads);
  });
}

inline bool cluster_launch_supported() {
  DeviceLimits limits;
  return device_limits(limits) == cudaSuccess && limits.cluster_launch;
}

// The fewest blocks (2, 4, 8 or 16) of kRowThreadsMax threads, `packs` each,
// that hold a row of `groups` packs: 0 when 16 do not.
inline int smallest_cluster(int64_t groups, int packs) {
  for (int cluster = 2; cluster <= 16; cluster *= 2)
    if (groups <= int64_t(cluster) * kRowThreadsMax * packs) return cluster;
  return 0;
}

// Clusters of at least this many blocks walk their rows where the caller
// has a walking kernel (one wave of resident clusters, each taking rows k,
// k + G, ...): launching a cluster per row leaves SMs idle until enough are
// free in one GPC at once. Measured on the H100 (NOTES.md): rms_norm rows of
// 262144 bf16 212 -> 186 µs, float32 477 -> 410, layer_norm float32
// 565 -> 486; clusters of 4 (bf16 65536 wide): layer_norm 220 -> 211,
// rms_norm 193 -> 190, and of 8 (131072): 228 -> 212, 200 -> 187. Clusters
// of 2 (bf16 32768) were mixed: layer_norm 3% faster, rms_norm and softmax
// 1-2% slower.
constexpr int kWalkClusterMin = 4;

// Rows beyond one block's registers, where thread-block clusters exist: a
// cluster of 2 to 16 blocks of kRowThreadsMax threads per row, in the
// smallest cluster that holds the row at 4 packs a thread (two blocks fit an
// SM), else 16 blocks of 8 packs (16 spill) where max_packs allows; {0, 0}
// where neither holds it. Walks that load their next row during an exchange
// (`prefetching_walk`: the norm forward's float and double rows that the
// pipelined kernel does not take) take 8 packs wherever that still makes a
// walking cluster: one block an SM with two rows in flight ran faster than
// two blocks with one (kPrefetchingWalk in norm_kernels.cuh has the numbers).
struct ClusterLanes {
  int packs, cluster;
};
inline ClusterLanes cluster_lanes(int64_t groups, int max_packs, bool prefetching_walk = false) {
  if (prefetching_walk && max_packs >= 8)
    if (const int cluster = smallest_cluster(groups, 8); cluster >= kWalkClusterMin) return {8, cluster};
  if (const int cluster = smallest_cluster(groups, 4)) return {4, cluster};
  if (max_packs >= 8 && smallest_cluster(groups, 8) == 16) return {8, 16};
  return {0, 0};
}

// Runs rows of 16-byte packs (loose ones where kLoose allows) in clusters as
// cluster_lanes() picks them. RowThreads combines the blocks' sums in
// distributed shared memory. Calls f(kPacks, RowVec, cluster blocks) or
// returns fallback().
template <typename T, int kMaxPacks, bool kLoose, typename F, typename Fallback>
cudaError_t with_cluster_lanes(int64_t n, std::initializer_list<const void*> buffers, F&& f, Fallback&& fallback,
                               bool prefetching_walk = false) {
  if (!cluster_launch_supported()) return fallback();
  return with_row_vec<T, kLoose>(n, buffers, [&](auto vec) {
    if constexpr (decltype(vec)::value == 1) {
      return fallback();
    } else {
      const ClusterLanes lanes = cluster_lanes(row_packs<decltype(vec)>(n), kMaxPacks, prefetching_walk);
      if (lanes.packs == 4) return f(std::integral_constant<int, 4>{}, vec, lanes.cluster);
      if constexpr (kMaxPacks >= 8)
        if (lanes.packs == 8) return f(std::integral_constant<int, 8>{}, vec, lanes.cluster);
      return fallback();
    }
  });
}

// Lets `kernel` run in clusters of `cluster` blocks with `shared_bytes` of
// dynamic shared memory each.
template <typename Kernel>
cudaError_t allow_clusters(Kernel kernel, int cluster, size_t shared_bytes) {
  if (const cudaError_t set = allow_shared_bytes(kernel, shared_bytes); set != cudaSuccess) return set;
  if (cluster <= 8) return cudaSuccess;
  return raise_attribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

inline cudaLaunchAttribute cluster_attribute(int cluster) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(cluster);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  return attribute;
}

// How many clusters of `kernel` run at once on the current device: 0 when
// unknown. Asked of the driver once per kernel, shape and device.
template <typename Kernel>
int resident_clusters(Kernel kernel, int cluster, int threads, size_t shared_bytes) {
  struct Known {
    const void* kernel;
    int device, cluster, threads;
    size_t shared_bytes;
    int resident;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const void* const key = reinterpret_cast<const void*>(kernel);
  auto same = [&](const Known& k) {
    return k.kernel == key && k.device == device && k.cluster == cluster && k.threads == threads &&
           k.shared_bytes == shared_bytes;
  };
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto entry = std::find_if(known.begin(), known.end(), same); entry != known.end()) return entry->resident;
  }
  if (allow_clusters(kernel, cluster, shared_bytes) != cudaSuccess) return 0;
  cudaLaunchAttribute attribute = cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(cluster));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int resident = 0;
  if (cudaOccupancyMaxActiveClusters(&resident, kernel, &config) != cudaSuccess) return 0;
  const std::lock_guard<std::mutex> lock(mutex);
  if (std::find_if(known.begin(), known.end(), same) == known.end())
    known.push_back({key, device, cluster, threads, shared_bytes, resident});
  return resident;
}

// `groups` clusters of `cluster` blocks of `threads`, each with `shared`
// bytes of dynamic shared memory; `args` are the kernel's arguments.
template <typename Kernel, typename Args>
cudaError_t launch_clusters(Kernel kernel, int64_t groups, int cluster, int threads, size_t shared,
                            cudaStream_t stream, const Args& args) {
  if (const cudaError_t set = allow_clusters(kernel, cluster, shared); set != cudaSuccess) return set;
  cudaLaunchAttribute attribute = cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(groups * cluster));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return std::apply([&](auto... a) { return cudaLaunchKernelEx(&config, kernel, a...); }, args);
}

// Rows past one block's registers (over kRowThreadsMax * 4 packs) of 16-byte
// packs run in the pipelined kernels (softmax_forward_pipelined_kernel,
// norm_forward_pipelined_kernel) where clusters exist: eight packs a thread
// held as words, in the smallest cluster of 256-thread blocks (two an SM)
// that holds the row, one wave of resident clusters walking the rows; a row
// that fewer than eight such blocks hold is spread over eight smaller ones
// (pipelined_blocks_of), two-byte ones at five packs where those fill the
// blocks better (launch_pipelined_rows); rows past 16 such blocks run in 16
// of 512 (pipelined_launch_of). Not for float rows that 2 blocks would hold (up to
// 16384 floats: softmax ran faster in the four-pack kernel, H200 129.4
// against 140.1 µs, and 4 blocks half idle took layer_norm (8192, 16384)
// from 275.5 to 353.9), rows past 16 blocks of 512, or elements of eight
// bytes.
constexpr int kPipelinedPacks = 8, kPipelinedThreads = 256;
// The smallest cluster of `threads`-thread blocks, `packs` packs a thread,
// that holds rows of `groups` 16-byte packs past one block's registers; 0
// where none of up to kClusterBlocksMax does, or clusters do not exist.
template <typename T>
int smallest_pipelined_cluster(int64_t groups, int threads, int packs) {
  if (sizeof(T) > 4 || groups <= int64_t(kRowThreadsMax) * 4 || !cluster_launch_supported()) return 0;
  for (int cluster = 2; cluster <= kClusterBlocksMax; cluster *= 2)
    if (groups <= int64_t(cluster) * threads * packs) return cluster;
  return 0;
}
// The 16-byte packs of a row of n elements in `buffers`: 0 where the rows
// are not whole packs (nor loose rows, where kLoose allows them: with_row_vec).
template <typename T, bool kLoose = false>
int64_t pipelined_groups(int64_t n, std::initializer_list<const void*> buffers) {
  int64_t groups = 0;
  with_row_vec<T, kLoose>(n, buffers, [&](auto vec) {
    if constexpr (decltype(vec)::value > 1) groups = row_packs<decltype(vec)>(n);
    return cudaSuccess;
  });
  return groups;
}
struct PipelinedBlocks {
  int threads, cluster;  // {0, 0}: not pipelined
};
// The pipelined forwards' blocks: clusters of eight or more. H200, µs, the
// smallest cluster of 256-thread blocks -> eight blocks: bf16 (4096, 32768)
// (two of 256 -> eight of 64) rms_norm 137.4-138.2 -> 132.6-132.8,
// layer_norm 142.1-142.5 -> 135.5-135.7, softmax 140.2-141.0 -> 136.6-137.2;
// (2048, 65536) (four of 256 -> eight of 128) rms_norm 133.7-134.0 ->
// 132.6-133.0, layer_norm 136.5-137.1 -> 135.1-135.8, softmax 137.3-137.4
// -> 135.9-136.0; float32 (2048, 32768) rms_norm 135.2-136.5 -> 132.5,
// layer_norm 134.3-134.5 -> 132.7-133.0. Sixteen blocks of 128 where eight
// of 256 do lost (bf16 131072 wide: rms_norm 136.5-136.8 -> 138.8-139.6).
constexpr int kPipelinedBlocksMin = 8;
template <typename T>
PipelinedBlocks pipelined_blocks_of(int64_t groups) {
  const int cluster = smallest_pipelined_cluster<T>(groups, kPipelinedThreads, kPipelinedPacks);
  if (cluster == 0 || (sizeof(T) > 2 && cluster <= 2)) return {0, 0};
  if (cluster >= kPipelinedBlocksMin) return {kPipelinedThreads, cluster};
  return {kPipelinedThreads * cluster / kPipelinedBlocksMin, kPipelinedBlocksMin};
}
// Rows past 8 blocks of 256 threads, in every pipelined forward (softmax,
// cross-entropy with its gradient, the norms): two-byte rows run in 8 blocks
// of 512 rather than 16 of 256, float rows stay in 16; both at
// kFewerPipelinedPacks a thread where those hold the row. H200, µs, 16 x 256
// at 8 packs -> the choice (bench/micro/pipelined_blocks.cu, two runs):
// bf16 (4096, 151936) softmax 755 -> 639, cross-entropy 808 -> 718,
// layer_norm 728 -> 685, rms_norm 742 -> 623; (4096, 163840) 774 -> 704,
// 818 -> 745, 755 -> 718, 786 -> 677; (4096, 200064) 902 -> 865, 956 ->
// 918; (1024, 262144) 274 -> 271, 284 -> 272; float32 (4096, 80000) at 5
// packs: 717 -> 667, 737 -> 723, 786 -> 659, 691 -> 658. In 8 blocks of
// 512 the float rows ran layer_norm (4096, 80000) at 753 (one block an SM)
// and softmax (1024, 131072) at 272 against 264; only cross-entropy's ran
// faster there (712 against 723 at 80000, 426 against 435 at 100000).
// kWideAtEightPacks: two-byte rows that take 8 packs a thread run in 8
// blocks of 512 too. The norms' do not: layer_norm bf16 (512, 262144) ran
// 136.6-137.7 in 16 x 256 and 139.5-140.2 in 8 x 512 (three runs; in
// bench/peers.py 138-143 against 140-141, within its spread), (1024, 262144)
// 269-271 against 272-273, (4096, 200064) 870 -> 839 (the one gain);
// rms_norm within 1% both ways.
constexpr int kFewerPipelinedPacks = 5;
struct PipelinedLaunch {
  PipelinedBlocks blocks;
  bool fewer_packs;  // kFewerPipelinedPacks a thread, else kPipelinedPacks
};
// Rows past 16 blocks of 256 at 8 packs run in 16 blocks of 512 (seven
// clusters at once), where the kernels' other choices were the lanes kernel
// (softmax, norms) and the split kernel (cross-entropy). H200, µs, those ->
// 16 x 512 (bench/micro/pipelined_blocks.cu; an earlier run of the float
// rows within 1.2%): bf16 (1024, 524288) softmax 711 -> 538, cross-entropy
// 747 -> 558, layer_norm 822 -> 533, rms_norm 796 -> 561; float32 (2048,
// 262144) 1099 -> 1064, 1236 -> 1063, 1143 -> 1118, 1070 -> 1068; float32
// (512, 262144) softmax 285.7 -> 269.3, layer_norm 294.0 -> 290.6, rms_norm
// 270.1 -> 271.3.
template <typename T, bool kWideAtEightPacks = true>
PipelinedLaunch pipelined_launch_of(int64_t groups) {
  if (sizeof(T) <= 4 && groups > int64_t(kClusterBlocksMax) * kPipelinedThreads * kPipelinedPacks &&
      groups <= int64_t(kClusterBlocksMax) * kRowThreadsMax * kPipelinedPacks && cluster_launch_supported())
    return {{kRowThreadsMax, kClusterBlocksMax}, false};
  const PipelinedBlocks blocks = pipelined_blocks_of<T>(groups);
  if (blocks.cluster <= kPipelinedBlocksMin) return {blocks, false};
  // 16 x 256 and 8 x 512 are as many threads: both hold as many packs.
  const bool fewer = groups <= int64_t(kRowThreadsMax) * kPipelinedBlocksMin * kFewerPipelinedPacks;
  if (sizeof(T) > 2 || (!fewer && !kWideAtEightPacks)) return {blocks, fewer};
  return {{kRowThreadsMax, kPipelinedBlocksMin}, fewer};
}

// A pipelined kernel in clusters of `cluster` blocks of `threads` with
// `shared` bytes of dynamic shared memory each, as many clusters as run at
// once; nothing (nullopt) where none fits this device (a MIG slice, or GPCs
// too small for 16 blocks of 512 at one an SM), and the caller takes
// another kernel.
template <typename Kernel, typename Args>
std::optional<cudaError_t> launch_pipelined(Kernel kernel, int64_t rows, int cluster, size_t shared,
                                            cudaStream_t stream, const Args& args, int threads = kPipelinedThreads) {
  const int resident = resident_clusters(kernel, cluster, threads, shared);
  if (resident == 0) return std::nullopt;
  return launch_clusters(kernel, std::min<int64_t>(rows, resident), cluster, threads, shared, stream, args);
}

// The fewest threads a block, whole warps, that hold `groups` packs in
// `cluster` blocks at `packs` a thread.
inline int64_t fewest_threads_holding(int64_t groups, int cluster, int packs) {
  return ceil_div(groups, int64_t(cluster) * packs * kWarpSize) * kWarpSize;
}

// Rows past kRowThreadsMax threads' kWideRowPacks<T> packs that
// kWideRowThreads threads hold (16385-32768 two-byte or float elements): the
// threads of their one block, whole warps; 0 for other rows.
template <typename T>
int wide_row_threads(int64_t n) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "two-byte or float rows");
  constexpr int kVec = Vec16<T>::kSize, kPacks = kWideRowPacks<T>;
  if (n <= int64_t(kPacks) * kRowThreadsMax * kVec || n > int64_t(kPacks) * kWideRowThreads * kVec) return 0;
  return int(fewest_threads_holding(n / kVec, 1, kPacks));
}

// Two-byte rows that pipelined_launch_of gives 8 blocks at 8 packs, filling
// under three quarters of their slots: the fewest warps that hold them at
// kFewerPipelinedPacks where those leave fewer slots empty; 0 else. Fuller
// blocks keep 8 packs: H100, bf16, µs, 8 packs -> 5 (`pipelined_blocks
// eight`), at 50304 (8 x 128 filled to 77% -> 8 x 160) softmax 285 -> 291,
// rms_norm 284 -> 287, cross-entropy 291 -> 291; at 100352 (77%, 8 x 256 ->
// 8 x 320) 285 -> 296, 283 -> 289, 292 -> 291 (the H200 gained 1-6% there).
template <typename T>
int fewer_packs_threads(int64_t groups, const PipelinedLaunch& eight) {
  if (sizeof(T) != 2 || eight.fewer_packs || eight.blocks.cluster != kPipelinedBlocksMin) return 0;
  const int64_t slots = int64_t(eight.blocks.threads) * kPipelinedPacks;  // a block's, in packs
  const bool sparse = 4 * groups < 3 * slots * eight.blocks.cluster;
  const int64_t threads = fewest_threads_holding(groups, eight.blocks.cluster, kFewerPipelinedPacks);
  const bool fewer_slots = threads * kFewerPipelinedPacks < slots;
  return threads <= kRowThreadsMax && sparse && fewer_slots ? int(threads) : 0;
}

// Where five packs a thread (fewer_packs_threads) replace eight: as many
// clusters resident, or (softmax) more. H200, µs, launchers, 8 packs -> 5
// (bench/micro/pipelined_blocks.cu `eight`; clusters resident at 8 -> 5):
// bf16 (5242, 40000) in 8 x 128, cross-entropy 246 -> 221 (62 -> 77),
// softmax 232 -> 216 (62 -> 124), layer_norm 228 -> 212, rms_norm 233 ->
// 209; (2621, 80000) in 8 x 256, 251 -> 241 (30 -> 30), 238 -> 213 (30 ->
// 62), 233 -> 227, 237 -> 205; (10485, 20000) in 8 x 64, cross-entropy 253
// -> 244 (124 -> 124), layer_norm 227 -> 222, rms_norm 231 -> 224, but
// softmax 231 -> 247 (124 -> 124). Fewer resident lost: (3200, 65536) 8 x
// 128 -> 8 x 224, cross-entropy 214 -> 272 (62 -> 30), layer_norm 207 -> 244.
enum class FewerPacks { kWhereAsManyResident, kWhereMoreResident };
// The pipelined kernel kernel_for(std::integral_constant<int, packs>) for
// rows of `groups` 16-byte packs, in the blocks of pipelined_launch_of or at
// fewer packs (kFewer), each block with slot_bytes of dynamic shared memory
// per pack a thread holds; nothing where it does not take the rows or no
// cluster fits (launch_pipelined).
template <typename T, bool kWideAtEightPacks = true, FewerPacks kFewer = FewerPacks::kWhereAsManyResident,
          typename KernelFor, typename Args>
std::optional<cudaError_t> launch_pipelined_rows(int64_t groups, int64_t rows, size_t slot_bytes,
                                                 cudaStream_t stream, const Args& args, KernelFor kernel_for) {
  PipelinedLaunch launch = pipelined_launch_of<T, kWideAtEightPacks>(groups);
  if (launch.blocks.cluster == 0) return std::nullopt;
  const auto eight = kernel_for(std::integral_constant<int, kPipelinedPacks>{});
  const auto five = kernel_for(std::integral_constant<int, kFewerPipelinedPacks>{});
  const int cluster = launch.blocks.cluster;
  const auto shared = [&](int packs, int threads) { return slot_bytes * packs * threads; };
  if (const int threads = fewer_packs_threads<T>(groups, launch)) {
    const int at_five = resident_clusters(five, cluster, threads, shared(kFewerPipelinedPacks, threads));
    const int at_eight =
        resident_clusters(eight, cluster, launch.blocks.threads, shared(kPipelinedPacks, launch.blocks.threads));
    if (kFewer == FewerPacks::kWhereMoreResident ? at_five > at_eight : at_five >= at_eight)
      launch = {{threads, cluster}, true};
  }
  const int packs = launch.fewer_packs ? kFewerPipelinedPacks : kPipelinedPacks;
  return launch_pipelined(launch.fewer_packs ? five : eight, rows, cluster, shared(packs, launch.blocks.threads),
                          stream, args, launch.blocks.threads);
}

// Whether clusters of at least kWalkClusterMin walk their rows: not at all,
// where the walking kernel keeps as many clusters resident as one row a
// cluster would, or (kPrefetching, with kernels that load their next row
// during an exchange) always at eight packs a thread, which cluster_lanes
// then prefers.
enum class Walks { kNone, kWhereResident, kPrefetching };

// Launches kernel_for(kPacks, RowVec) for `blocks` rows, a block or a
// cluster of blocks each, as with_block_lanes or with_cluster_lanes pick
// them (loose rows where kLoose allows).
// With kWalks, kernel_for takes a third argument: std::true_type for the
// walking kernel (with `walk_bytes_per_pack` of dynamic shared memory per
// pack a thread holds), std::false_type else. Rows of one block of 16-byte
// packs get `staged_bytes_per_pack` more per pack a thread holds.
template <typename T, int kMaxPacks, Walks kWalks = Walks::kNone, bool kLoose = false, typename KernelFor,
          typename Args, typename Fallback>
cudaError_t launch_block_lanes(int64_t blocks, size_t shared_bytes, int64_t n,
                               std::initializer_list<const void*> buffers, cudaStream_t stream,
                               KernelFor&& kernel_for, const Args& args, Fallback&& fallback,
                               size_t walk_bytes_per_pack = 0, size_t staged_bytes_per_pack = 0) {
  auto one_row_kernel = [&](auto packs, auto vec) {
    if constexpr (kWalks != Walks::kNone) return kernel_for(packs, vec, std::false_type{});
    else return kernel_for(packs, vec);
  };
  auto in_clusters = [&] {
    return with_cluster_lanes<T, kMaxPacks, kLoose>(
        n, buffers,
        [&](auto packs, auto vec, int cluster) {
          auto launch = [&](auto kernel, int64_t groups, size_t shared) {
            return launch_clusters(kernel, groups, cluster, kRowThreadsMax, shared, stream, args);
          };
          const auto one_row = one_row_kernel(packs, vec);
          if constexpr (kWalks != Walks::kNone) {
            // The walking kernel's registers and shared memory may halve the
            // clusters resident; a prefetching walk of eight packs runs so
            // by design (two rows in flight a block).
            if (cluster >= kWalkClusterMin) {
              const auto walking = kernel_for(packs, vec, std::true_type{});
              const size_t shared = walk_bytes_per_pack * decltype(packs)::value;
              const int resident = resident_clusters(walking, cluster, kRowThreadsMax, shared);
              const bool prefetching = kWalks == Walks::kPrefetching && decltype(packs)::value == 8;
              if (resident > 0 &&
                  (prefetching || resident >= resident_clusters(one_row, cluster, kRowThreadsMax, shared_bytes)))
                return launch(walking, std::min<int64_t>(blocks, resident), shared);
            }
          }
          return launch(one_row, blocks, shared_bytes);
        },
        fallback, kWalks == Walks::kPrefetching);
  };
  return with_block_lanes<T, kLoose>(
      n, buffers,
      [&](auto packs, auto vec, int threads) {
        const auto kernel = one_row_kernel(packs, vec);
        constexpr bool kWholePacks = decltype(vec)::value == Vec16<T>::kSize && !decltype(vec)::loose;
        const size_t shared =
            shared_bytes + (kWholePacks ? staged_bytes_per_pack * threads * decltype(packs)::value : 0);
        if (const cudaError_t set = allow_shared_bytes(kernel, shared); set != cudaSuccess) return set;
        std::apply([&](auto... a) { kernel<<<blocks, threads, shared, stream>>>(a...); }, args);
        return cudaGetLastError();
      },
      in_clusters);
}

// One block per row with `slots` rows of n accumulators staged in shared
// memory (stage_slot) when they fit; the kernel's last argument says whether
// they did.
template <typename Kernel, typename Args>
cudaError_t launch_block_rows(Kernel kernel, int slots, size_t acc_size, int64_t rows, int64_t n,
                              cudaStream_t stream, const Args& args) {
  const size_t bytes = fitting_shared_bytes(kernel, slots * stage_slot_bytes(n, acc_size));
  std::apply([&](auto... a) { kernel<<<rows, row_threads(n), bytes, stream>>>(a..., bytes > 0); }, args);
  return cudaGetLastError();
}

template <typename F>
cudaError_t dispatch_floating(DType dtype, F&& f) {
  return visit_dtype<__half, __nv_bfloat16>(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::numeric_limits<T>::is_integer) return cudaErrorInvalidValue;
    else return f(tag);
  });
}

}  // namespace rows
}  // namespace fastreduce
