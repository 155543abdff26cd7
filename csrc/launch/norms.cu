#include "norms.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <initializer_list>
#include <tuple>

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

// Dynamic shared memory for `slots` cached rows of n accumulators, or 0 when
// they do not fit (the kernel then streams from global memory).
template <typename Kernel>
size_t cache_bytes(Kernel kernel, int slots, int64_t n, size_t acc_size) {
  const size_t bytes = slots * ((n * acc_size + 15) / 16 * 16);
  int device = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;
  if (bytes > size_t(limit) - 1024) return 0;  // leave room for the static scratch
  if (bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess)
    return 0;
  return bytes;
}

// Rows up to this length run one warp each, in registers.
constexpr int64_t kWarpRowMax = 1024;

// Calls f(kPerLane, kVec) as integral constants: kVec 16-byte packs when every
// row of n elements of every buffer starts 16-byte aligned (else 1), and kPerLane the
// smallest power of two, at least kVec, with 32 * kPerLane >= n.
template <typename T, typename F>
cudaError_t with_lanes(int64_t n, std::initializer_list<const void*> buffers, F&& f) {
  constexpr int kPack = Vec16<T>::kSize;
  bool packed = n % kPack == 0;
  for (const void* buffer : buffers) packed = packed && reinterpret_cast<uintptr_t>(buffer) % 16 == 0;
  auto pick = [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    auto call = [&](auto per_lane) {
      constexpr int kPerLane = decltype(per_lane)::value < kVec ? kVec : decltype(per_lane)::value;
      return f(std::integral_constant<int, kPerLane>{}, vec);
    };
    if (n <= 32) return call(std::integral_constant<int, 1>{});
    if (n <= 64) return call(std::integral_constant<int, 2>{});
    if (n <= 128) return call(std::integral_constant<int, 4>{});
    if (n <= 256) return call(std::integral_constant<int, 8>{});
    if (n <= 512) return call(std::integral_constant<int, 16>{});
    return call(std::integral_constant<int, 32>{});
  };
  if (packed) return pick(std::integral_constant<int, kPack>{});
  return pick(std::integral_constant<int, 1>{});
}

int64_t warp_row_blocks(int64_t rows) { return ceil_div(rows, kWarpRowsPerBlock); }
constexpr int kWarpRowThreads = kWarpRowsPerBlock * kWarpSize;

// One warp per row (rows up to kWarpRowMax); `args` are the kernel's arguments.
template <typename Kernel, typename Args>
cudaError_t launch_warp_rows(Kernel kernel, int64_t rows, cudaStream_t stream, const Args& args) {
  std::apply([&](auto... a) { kernel<<<warp_row_blocks(rows), kWarpRowThreads, 0, stream>>>(a...); }, args);
  return cudaGetLastError();
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

struct ParamGradPlan {
  int64_t chunks, rows_per_chunk;
  size_t partial_bytes;  // one of the two partial buffers
};

ParamGradPlan param_grad_plan(DType dtype, int64_t rows, int64_t n, int sm_count) {
  const int64_t tiles = ceil_div(n, kGradTile);
  const int64_t chunks = std::max<int64_t>(1, std::min(ceil_div(int64_t(sm_count) * 8, tiles), ceil_div(rows, 64)));
  const size_t acc = dtype == DType::Double ? 8 : 4;
  return {chunks, ceil_div(rows, chunks), (chunks * n * acc + 255) / 256 * 256};
}

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
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {x, y}, [&](auto per_lane, auto vec) {
        return launch_warp_rows(
            layer_norm_forward_warp_kernel<T, decltype(per_lane)::value, decltype(vec)::value>, rows, stream,
            std::tuple_cat(args, std::make_tuple(rows, n, static_cast<A>(eps))));
      });
    return launch_block_rows(layer_norm_forward_kernel<T>, 1, sizeof(A), rows, n, stream,
                             std::tuple_cat(args, std::make_tuple(n, static_cast<A>(eps))));
  });
}

size_t layer_norm_backward_workspace_bytes(DType dtype, int64_t rows, int64_t n, int sm_count) {
  const ParamGradPlan plan = param_grad_plan(dtype, rows, n, sm_count);
  const ReduceProblem columns{ReduceKind::Sum, acc_dtype(dtype), nullptr, 1, plan.chunks, n};
  return 2 * plan.partial_bytes + reduce_workspace_bytes(columns, sm_count);
}

cudaError_t layer_norm_backward(DType dtype, const void* dy, const void* x, const void* mean, const void* rstd,
                                const void* weight, void* dx, void* dweight, void* dbias, int64_t rows, int64_t n,
                                void* workspace, int sm_count, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(dy), static_cast<const T*>(x),
                                      static_cast<const A*>(mean), static_cast<const A*>(rstd),
                                      static_cast<const T*>(weight), static_cast<T*>(dx));
    cudaError_t err =
        n <= kWarpRowMax
            ? with_lanes<T>(n, {x, dy, dx},
                            [&](auto per_lane, auto vec) {
                              return launch_warp_rows(
                                  layer_norm_backward_input_warp_kernel<T, decltype(per_lane)::value,
                                                                        decltype(vec)::value>,
                                  rows, stream, std::tuple_cat(args, std::make_tuple(rows, n)));
                            })
            : launch_block_rows(layer_norm_backward_input_kernel<T>, 2, sizeof(A), rows, n, stream,
                                std::tuple_cat(args, std::make_tuple(n)));
    if (err != cudaSuccess || !dweight) return err;

    const ParamGradPlan plan = param_grad_plan(dtype, rows, n, sm_count);
    auto* bytes_base = static_cast<unsigned char*>(workspace);
    auto* partial_w = reinterpret_cast<A*>(bytes_base);
    auto* partial_b = reinterpret_cast<A*>(bytes_base + plan.partial_bytes);
    void* reduce_scratch = bytes_base + 2 * plan.partial_bytes;
    layer_norm_backward_params_kernel<T><<<dim3(ceil_div(n, kGradTile), plan.chunks), kGradTile * kGradLanes, 0,
                                           stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                     static_cast<const A*>(mean), static_cast<const A*>(rstd),
                                                     partial_w, partial_b, rows, n, plan.rows_per_chunk);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
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
    const auto shape = std::make_tuple(n, causal, static_cast<A>(scale));
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {x, y}, [&](auto per_lane, auto vec) {
        return launch_warp_rows(softmax_forward_warp_kernel<T, decltype(per_lane)::value, decltype(vec)::value>,
                                rows, stream, std::tuple_cat(args, std::make_tuple(rows), shape));
      });
    return launch_block_rows(softmax_forward_kernel<T>, 1, sizeof(A), rows, n, stream, std::tuple_cat(args, shape));
  });
}

cudaError_t softmax_backward(DType dtype, const void* dy, const void* y, void* dx, int64_t rows, int64_t n,
                             int64_t causal, double scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    const auto args = std::make_tuple(static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx));
    const auto shape = std::make_tuple(n, causal, static_cast<A>(scale));
    if (n <= kWarpRowMax)
      return with_lanes<T>(n, {y, dy, dx}, [&](auto per_lane, auto vec) {
        return launch_warp_rows(softmax_backward_warp_kernel<T, decltype(per_lane)::value, decltype(vec)::value>,
                                rows, stream, std::tuple_cat(args, std::make_tuple(rows), shape));
      });
    return launch_block_rows(softmax_backward_kernel<T>, 2, sizeof(A), rows, n, stream, std::tuple_cat(args, shape));
  });
}

}  // namespace fastreduce
