#include "norms.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "../kernels/norm_kernels.cuh"
#include "reduce.h"

namespace fastreduce {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// About eight elements per thread, 32 to 1024 threads.
int row_threads(int64_t n) {
  int threads = 32;
  while (threads < 1024 && threads * 8 < n) threads *= 2;
  return threads;
}

// Lets `kernel` take `bytes` of dynamic shared memory (beyond 48 KiB it must opt in).
template <typename Kernel>
cudaError_t allow_shared_bytes(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

// Dynamic shared memory for `slots` rows of n elements of elem_size bytes, in
// the kernels' row_cache() layout, or 0 when they do not fit.
template <typename Kernel>
size_t cache_bytes(Kernel kernel, int slots, int64_t n, size_t elem_size) {
  const size_t bytes = slots * ((n * elem_size + 15) / 16 * 16);
  int device = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;
  if (bytes > size_t(limit) - 1024) return 0;  // leave room for the static scratch
  return allow_shared_bytes(kernel, bytes) == cudaSuccess ? bytes : 0;
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

// Calls f(kPerLane, kVec) as integral constants, kVec as with_vec. kPerLane:
// packed, the fewest of 1, 2, 3, 4, 6, 8, ... packs per lane that cover n
// (768 floats: 6 packs, no idle registers); unpacked, a power of two.
template <typename T, typename F>
cudaError_t with_lanes(int64_t n, std::initializer_list<const void*> buffers, F&& f) {
  if (packable<T>(n, buffers))
    return with_count<Vec16<T>::kSize>(n, std::integer_sequence<int, 1, 2, 3, 4, 6, 8, 12, 16>{}, f);
  return with_count<1>(n, std::integer_sequence<int, 1, 2, 4, 8, 16, 32>{}, f);
}

int64_t warp_row_blocks(int64_t rows) { return ceil_div(rows, kWarpRowsPerBlock); }
constexpr int kWarpRowThreads = kWarpRowsPerBlock * kWarpSize;

// One warp per row (rows up to kWarpRowMax); `args` are the kernel's arguments.
template <typename Kernel, typename Args>
cudaError_t launch_warp_rows(Kernel kernel, int64_t rows, cudaStream_t stream, const Args& args,
                             int rows_per_block = kWarpRowsPerBlock) {
  const int64_t blocks = ceil_div(rows, rows_per_block);
  std::apply([&](auto... a) { kernel<<<blocks, rows_per_block * kWarpSize, 0, stream>>>(a...); }, args);
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
// the fewest threads (a power of two) that hold the row's packs four at most
// each, or 0 when that takes more than kRowThreadsMax.
int block_lane_threads(int64_t groups) {
  int threads = kWarpSize;
  while (threads * int64_t(4) < groups) threads *= 2;
  return threads <= kRowThreadsMax ? threads : 0;
}

// Launches kernel_for(kPacks, kVec) (integral constants) on `blocks` blocks
// that share each row with the row in registers, or returns fallback() when
// the row does not fit. Rows beyond kWarpRowMax have over 128 packs, so 3 or
// 4 per thread.
template <typename T, typename KernelFor, typename Args, typename Fallback>
cudaError_t launch_block_lanes(int64_t blocks, size_t shared_bytes, int64_t n,
                               std::initializer_list<const void*> buffers, cudaStream_t stream,
                               KernelFor&& kernel_for, const Args& args, Fallback&& fallback) {
  return with_vec<T>(n, buffers, [&](auto vec) {
    const int64_t groups = n / decltype(vec)::value;
    const int threads = block_lane_threads(groups);
    if (threads == 0) return fallback();
    auto launch = [&](auto packs) {
      const auto kernel = kernel_for(packs, vec);
      if (const cudaError_t set = allow_shared_bytes(kernel, shared_bytes); set != cudaSuccess) return set;
      std::apply([&](auto... a) { kernel<<<blocks, threads, shared_bytes, stream>>>(a...); }, args);
      return cudaGetLastError();
    };
    return ceil_div(groups, threads) <= 3 ? launch(std::integral_constant<int, 3>{})
                                          : launch(std::integral_constant<int, 4>{});
  });
}

// One block per row with `slots` rows of n accumulators cached in shared
// memory when they fit; the kernel's last argument says whether they did.
template <typename Kernel, typename Args>
cudaError_t launch_block_rows(Kernel kernel, int slots, size_t acc_size, int64_t rows, int64_t n,
                              cudaStream_t stream, const Args& args) {
  const size_t bytes = cache_bytes(kernel, slots, n, acc_size);
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

DType acc_dtype(DType dtype) { return dtype == DType::Double ? DType::Double : DType::Float; }

// Weight and bias gradients come in two stages: partial rows, then a column
// sum of them. Stage one is fused into the dx kernel where the rows are in
// registers: rows of up to kWarpRowMax in one wave of at most
// kFusedBlocksPerSm blocks, each folding its rows into one partial row (its
// shared memory holds every warp's sums); longer rows in about
// kLongRowBlocksPerSm blocks per SM of consecutive rows each. Otherwise (rows
// too long for registers or shared memory) a separate pass reads x and dy.
constexpr int kFusedBlocksPerSm = 2;
constexpr int kLongRowBlocksPerSm = 8;

struct ParamGradPlan {
  bool fused;
  int64_t chunks;          // partial rows
  int64_t rows_per_chunk;  // rows per warp or block of the dx kernel when fused, per chunk of the separate pass
  size_t shared_bytes;     // fused only
  size_t partial_bytes;    // each of the two partial buffers
};

// `vec`: the elements per pack the dx kernel will load (1 where the buffers
// are not 16-byte packable).
ParamGradPlan param_grad_plan(DType dtype, int64_t rows, int64_t n, int vec, int sm_count) {
  const size_t acc = dtype == DType::Double ? 8 : 4;
  auto partial_bytes = [&](int64_t chunks) { return (chunks * n * acc + 255) / 256 * 256; };
  int device = 0, per_block = 0, per_sm = 0;
  const bool known = cudaGetDevice(&device) == cudaSuccess &&
                     cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
                         cudaSuccess &&
                     cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) ==
                         cudaSuccess;
  const size_t slot_bytes = (n * acc + 15) / 16 * 16;  // one row_cache() slot
  if (n <= kWarpRowMax) {
    const size_t shared = 2 * kWarpRowsPerBlock * slot_bytes;
    if (known && shared <= size_t(per_block)) {
      const int64_t blocks_per_sm = std::clamp<int64_t>(per_sm / (shared + 1024), 1, kFusedBlocksPerSm);
      const int64_t chunks = std::min(warp_row_blocks(rows), sm_count * blocks_per_sm);
      return {true, chunks, ceil_div(rows, chunks * kWarpRowsPerBlock), shared, partial_bytes(chunks)};
    }
  } else {
    const size_t shared = 2 * slot_bytes;
    if (known && block_lane_threads(n / vec) != 0 && shared + 1024 <= size_t(per_block)) {
      const int64_t rows_per_chunk = ceil_div(rows, std::min<int64_t>(rows, int64_t(sm_count) * kLongRowBlocksPerSm));
      const int64_t chunks = ceil_div(rows, rows_per_chunk);
      return {true, chunks, rows_per_chunk, shared, partial_bytes(chunks)};
    }
  }
  const int64_t tiles = ceil_div(n, kGradTile);
  const int64_t chunks = std::max<int64_t>(1, std::min(ceil_div(int64_t(sm_count) * 8, tiles), ceil_div(rows, 64)));
  return {false, chunks, ceil_div(rows, chunks), 0, partial_bytes(chunks)};
}

// Elements per 16-byte pack of a floating dtype.
int pack_elements(DType dtype) { return dtype == DType::Double ? 2 : dtype == DType::Float ? 4 : 8; }

}  // namespace

cudaError_t layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, void* y,
                               void* mean, void* rstd, int64_t rows, int64_t n, double eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(x), static_cast<const T*>(weight),
                                      static_cast<const T*>(bias), static_cast<T*>(y), static_cast<A*>(mean),
                                      static_cast<A*>(rstd));
    const auto row_args = std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), static_cast<A>(eps)));
    if (n > kWarpRowMax)
      return launch_block_lanes<T>(
          rows, 0, n, {x, y, weight, bias}, stream,
          [](auto packs, auto vec) {
            return layer_norm_forward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false>;
          },
          row_args, [&] {
            return launch_block_rows(layer_norm_forward_kernel<T>, 1, sizeof(A), rows, n, stream,
                                     std::tuple_cat(args, std::make_tuple(n, static_cast<A>(eps))));
          });
    // Float rows in registers: 93 registers at (8192, 768), so four-warp
    // blocks (20 warps per SM; eight-warp blocks fit 16). Two-byte rows in
    // registers leave too few bytes in flight per SM (bf16 13.8 µs against
    // 11.8 staged), and double rows would not fit in registers.
    if constexpr (std::is_same_v<T, float>) {
      return with_lanes<T>(n, {x, y, weight, bias}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        return launch_warp_rows(layer_norm_forward_lanes_kernel<T, decltype(per_lane)::value / kVec, kVec, true>,
                                rows, stream, row_args, 4);
      });
    } else {
      return with_vec<T>(n, {x, y, weight, bias}, [&](auto vec) {
        return launch_staged_rows(layer_norm_forward_warp_kernel<T, decltype(vec)::value>, rows, n, sizeof(T),
                                  stream, row_args);
      });
    }
  });
}

// Enough for either plan: whether the rows are packable is known at launch.
size_t layer_norm_backward_workspace_bytes(DType dtype, int64_t rows, int64_t n, int sm_count) {
  size_t bytes = 0;
  for (const int vec : {1, pack_elements(dtype)}) {
    const ParamGradPlan plan = param_grad_plan(dtype, rows, n, vec, sm_count);
    const ReduceProblem columns{ReduceKind::Sum, acc_dtype(dtype), nullptr, 1, plan.chunks, n};
    bytes = std::max(bytes, 2 * plan.partial_bytes + reduce_workspace_bytes(columns, sm_count));
  }
  return bytes;
}

cudaError_t layer_norm_backward(DType dtype, const void* dy, const void* x, const void* mean, const void* rstd,
                                const void* weight, void* dx, void* dweight, void* dbias, int64_t rows, int64_t n,
                                void* workspace, int sm_count, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const int vec = packable<T>(n, {x, dy, dx, weight}) ? Vec16<T>::kSize : 1;
    const ParamGradPlan plan = param_grad_plan(dtype, rows, n, vec, sm_count);
    const bool params = dweight != nullptr;
    auto* bytes_base = static_cast<unsigned char*>(workspace);
    A* partial_w = params ? reinterpret_cast<A*>(bytes_base) : nullptr;
    A* partial_b = params ? reinterpret_cast<A*>(bytes_base + plan.partial_bytes) : nullptr;
    const auto* dy_t = static_cast<const T*>(dy);
    const auto* x_t = static_cast<const T*>(x);
    const auto* mean_a = static_cast<const A*>(mean);
    const auto* rstd_a = static_cast<const A*>(rstd);
    const auto* weight_t = static_cast<const T*>(weight);

    const bool fused = params && plan.fused;
    const size_t shared = fused ? plan.shared_bytes : 0;
    const int64_t rows_per_group = fused ? plan.rows_per_chunk : 1;  // unfused: a row per warp or block
    const auto args = std::make_tuple(dy_t, x_t, mean_a, rstd_a, weight_t, static_cast<T*>(dx),
                                      fused ? partial_w : nullptr, fused ? partial_b : nullptr, rows,
                                      static_cast<int>(n), rows_per_group);
    cudaError_t err = cudaSuccess;
    if (n <= kWarpRowMax) {
      err = with_lanes<T>(n, {x, dy, dx, weight}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        const auto kernel = layer_norm_backward_lanes_kernel<T, decltype(per_lane)::value / kVec, kVec, true>;
        if (const cudaError_t set = allow_shared_bytes(kernel, shared); set != cudaSuccess) return set;
        std::apply([&](auto... a) {
          kernel<<<fused ? plan.chunks : warp_row_blocks(rows), kWarpRowThreads, shared, stream>>>(a...);
        }, args);
        return cudaGetLastError();
      });
    } else {
      err = launch_block_lanes<T>(
          fused ? plan.chunks : rows, shared, n, {x, dy, dx, weight}, stream,
          [](auto packs, auto vec) {
            return layer_norm_backward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false>;
          },
          args, [&] {
            return launch_block_rows(layer_norm_backward_input_kernel<T>, 2, sizeof(A), rows, n, stream,
                                     std::make_tuple(dy_t, x_t, mean_a, rstd_a, weight_t, static_cast<T*>(dx), n));
          });
    }
    if (err != cudaSuccess || !params) return err;

    if (!plan.fused) {
      layer_norm_backward_params_kernel<T><<<dim3(ceil_div(n, kGradTile), plan.chunks), kGradTile * kGradLanes, 0,
                                             stream>>>(dy_t, x_t, mean_a, rstd_a, partial_w, partial_b, rows, n,
                                                       plan.rows_per_chunk);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    void* reduce_scratch = bytes_base + 2 * plan.partial_bytes;
    const ReduceProblem sum_w{ReduceKind::Sum, acc_dtype(dtype), partial_w, 1, plan.chunks, n};
    if ((err = reduce(sum_w, dweight, reduce_scratch, sm_count, stream)) != cudaSuccess) return err;
    const ReduceProblem sum_b{ReduceKind::Sum, acc_dtype(dtype), partial_b, 1, plan.chunks, n};
    return reduce(sum_b, dbias, reduce_scratch, sm_count, stream);
  });
}

cudaError_t softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t n, int64_t causal,
                            double scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(x), static_cast<T*>(y));
    const auto row_args =
        std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), causal, static_cast<A>(scale)));
    if (n <= kWarpRowMax)
      return with_vec<T>(n, {x, y}, [&](auto vec) {
        return launch_staged_rows(softmax_forward_warp_kernel<T, decltype(vec)::value>, rows, n, sizeof(T), stream,
                                  row_args);
      });
    return launch_block_lanes<T>(
        rows, 0, n, {x, y}, stream,
        [](auto packs, auto vec) {
          return softmax_forward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false>;
        },
        row_args, [&] {
          return launch_block_rows(softmax_forward_kernel<T>, 1, sizeof(A), rows, n, stream,
                                   std::tuple_cat(args, std::make_tuple(n, causal, static_cast<A>(scale))));
        });
  });
}

cudaError_t softmax_backward(DType dtype, const void* dy, const void* y, void* dx, int64_t rows, int64_t n,
                             int64_t causal, double scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx));
    const auto row_args =
        std::tuple_cat(args, std::make_tuple(rows, static_cast<int>(n), causal, static_cast<A>(scale)));
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {y, dy, dx}, [&](auto per_lane, auto vec) {
        constexpr int kVec = decltype(vec)::value;
        return launch_warp_rows(softmax_backward_lanes_kernel<T, decltype(per_lane)::value / kVec, kVec, true>,
                                rows, stream, row_args);
      });
    return launch_block_lanes<T>(
        rows, 0, n, {y, dy, dx}, stream,
        [](auto packs, auto vec) {
          return softmax_backward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false>;
        },
        row_args, [&] {
          return launch_block_rows(softmax_backward_kernel<T>, 2, sizeof(A), rows, n, stream,
                                   std::tuple_cat(args, std::make_tuple(n, causal, static_cast<A>(scale))));
        });
  });
}

}  // namespace fastreduce
