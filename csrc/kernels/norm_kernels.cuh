// layer_norm and softmax (plain and GPT-2 causal), forward and backward, on
// the project's warp and block reduce. Three shapes of kernel:
// - rows in registers as the 16-byte packs they were read in, shared by one
//   warp (rows up to 1024: float layer_norm forward, softmax backward) or by
//   one block (longer rows, up to 512 threads of 4 packs: 8192 floats, 16384
//   bf16), every load in flight before the first reduction;
// - short rows, other forwards: one warp per row, the row staged in shared
//   memory with cp.async; the fused layer_norm backward: one warp per row in
//   registers, weight and bias gradient sums in shared memory;
// - rows longer than that, or not 16-byte aligned beyond 2048 elements: one
//   block per row, the row cached in shared memory as the accumulator type
//   when it fits, streamed from global memory on each pass otherwise.
#pragma once

#include "block_reduce.cuh"

namespace fastreduce {

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Softmax works in base 2: inputs are multiplied by scale * log2(e) once, so
// each element costs one exp2 (a single MUFU.EX2 for float) after the max.
constexpr double kLog2e = 1.4426950408889634;
// Float: one MUFU.EX2; results below 2^-126 flush to 0, which a softmax
// term that small is anyway next to the row's largest (2^0).
__device__ __forceinline__ float exp2_acc(float v) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(v));
  return result;
}
__device__ __forceinline__ double exp2_acc(double v) { return exp2(v); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return rsqrt(v); }

// A row, read from its shared-memory copy when there is one.
template <typename T, typename A>
struct Row {
  const T* global;
  const A* cache;
  __device__ __forceinline__ A operator[](int64_t i) const { return cache ? cache[i] : static_cast<A>(global[i]); }
};

// Copies row[0, n) into `cache` (if not null) and returns the view of it.
// Ends with a barrier.
template <typename T, typename A>
__device__ Row<T, A> stage_row(const T* row, int64_t n, A* cache) {
  if (cache) {
    constexpr int kVec = Vec16<T>::kSize;
    int64_t done = 0;
    if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
      const auto* packs = reinterpret_cast<const Vec16<T>*>(row);
      auto* out = reinterpret_cast<VecN<A, kVec>*>(cache);
      done = n / kVec * kVec;
      for (int64_t i = threadIdx.x; i < n / kVec; i += blockDim.x) {
        const Vec16<T> p = packs[i];
        VecN<A, kVec> converted;
#pragma unroll
        for (int k = 0; k < kVec; ++k) converted.elem[k] = static_cast<A>(p.elem[k]);
        out[i] = converted;
      }
    }
    for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) cache[i] = static_cast<A>(row[i]);
  }
  __syncthreads();
  return {row, cache};
}

// Slot `slot` of the block's dynamic shared memory, laid out as 16-byte
// aligned slots of n elements of E (the launchers size it the same way).
template <typename E>
__device__ __forceinline__ E* row_cache(int slot, int64_t n) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t stride = (n * sizeof(E) + 15) / 16 * 16;
  return reinterpret_cast<E*>(shared_bytes + slot * stride);
}

template <typename T>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                          const T* __restrict__ bias, T* __restrict__ y,
                                          opmath_t<T>* __restrict__ mean_out, opmath_t<T>* __restrict__ rstd_out,
                                          int64_t n, opmath_t<T> eps, bool cached) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t offset = blockIdx.x * n;
  const Row<T, A> row = stage_row(x + offset, n, cached ? row_cache<A>(0, n) : nullptr);
  A sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i];
  const A mean = block_allreduce<SumOp<A>>(sum, scratch) / static_cast<A>(n);
  A squares = 0;  // two passes: no cancellation in E[x^2] - mean^2
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A d = row[i] - mean;
    squares += d * d;
  }
  const A rstd = rsqrt_acc(block_allreduce<SumOp<A>>(squares, scratch) / static_cast<A>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = (row[i] - mean) * rstd;
    if (weight) v *= static_cast<A>(weight[i]);
    if (bias) v += static_cast<A>(bias[i]);
    y[offset + i] = static_cast<T>(v);
  }
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight.
template <typename T>
__global__ void layer_norm_backward_input_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                 const opmath_t<T>* __restrict__ mean,
                                                 const opmath_t<T>* __restrict__ rstd, const T* __restrict__ weight,
                                                 T* __restrict__ dx, int64_t n, bool cached) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t offset = blockIdx.x * n;
  const Row<T, A> xs = stage_row(x + offset, n, cached ? row_cache<A>(0, n) : nullptr);
  const Row<T, A> gs = stage_row(dy + offset, n, cached ? row_cache<A>(1, n) : nullptr);
  const A mu = mean[blockIdx.x], r = rstd[blockIdx.x];
  A sum_g = 0, sum_gx = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A g = weight ? gs[i] * static_cast<A>(weight[i]) : gs[i];
    sum_g += g;
    sum_gx += g * (xs[i] - mu) * r;
  }
  const A mean_g = block_allreduce<SumOp<A>>(sum_g, scratch) / static_cast<A>(n);
  const A mean_gx = block_allreduce<SumOp<A>>(sum_gx, scratch) / static_cast<A>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const A g = weight ? gs[i] * static_cast<A>(weight[i]) : gs[i];
    dx[offset + i] = static_cast<T>(r * (g - mean_g - (xs[i] - mu) * r * mean_gx));
  }
}

// Stage one of the weight and bias gradients: block (column tile, row chunk)
// writes partial[chunk, c] = sum over its rows of dy * xhat (and of dy).
// Stage two is a column reduction of the partials (fixed order: deterministic).
constexpr int kGradTile = 32, kGradLanes = 8;
template <typename T>
__global__ void __launch_bounds__(kGradTile* kGradLanes)
    layer_norm_backward_params_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ rstd,
                                      opmath_t<T>* __restrict__ partial_w, opmath_t<T>* __restrict__ partial_b,
                                      int64_t rows, int64_t n, int64_t rows_per_chunk) {
  using A = opmath_t<T>;
  __shared__ A tile_w[kGradLanes][kGradTile + 1], tile_b[kGradLanes][kGradTile + 1];
  const int tx = threadIdx.x % kGradTile, ty = threadIdx.x / kGradTile;
  const int64_t c = blockIdx.x * int64_t(kGradTile) + tx;
  const int64_t first = blockIdx.y * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  A w = 0, b = 0;
  if (c < n) {
    for (int64_t r = first + ty; r < last; r += kGradLanes) {
      const A g = static_cast<A>(dy[r * n + c]);
      w += g * (static_cast<A>(x[r * n + c]) - mean[r]) * rstd[r];
      b += g;
    }
  }
  tile_w[ty][tx] = w;
  tile_b[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < n) {
    for (int k = 1; k < kGradLanes; ++k) {
      w += tile_w[k][tx];
      b += tile_b[k][tx];
    }
    partial_w[blockIdx.y * n + c] = w;
    partial_b[blockIdx.y * n + c] = b;
  }
}

// Softmax of scale * row over its first `valid` entries, zeros after them:
// valid = n for softmax, row % causal + 1 for the causal attention softmax
// (which then never reads the upper triangle).
template <typename T>
__global__ void softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t causal,
                                       opmath_t<T> scale, bool cached) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t offset = blockIdx.x * n;
  const int64_t valid = causal ? blockIdx.x % causal + 1 : n;
  const Row<T, A> row = stage_row(x + offset, valid, cached ? row_cache<A>(0, n) : nullptr);
  const A scale2 = scale * static_cast<A>(kLog2e);
  A top = MaxOp<A>::identity();
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) top = MaxOp<A>::combine(top, scale2 * row[i]);
  top = block_allreduce<MaxOp<A>>(top, scratch);
  A sum = 0;
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) sum += exp2_acc(scale2 * row[i] - top);
  const A inv = A(1) / block_allreduce<SumOp<A>>(sum, scratch);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[offset + i] = static_cast<T>(i < valid ? exp2_acc(scale2 * row[i] - top) * inv : A(0));
}

// dx = scale * y * (dy - sum(y * dy)) over the valid entries, zeros after.
template <typename T>
__global__ void softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                        int64_t n, int64_t causal, opmath_t<T> scale, bool cached) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t offset = blockIdx.x * n;
  const int64_t valid = causal ? blockIdx.x % causal + 1 : n;
  const Row<T, A> ys = stage_row(y + offset, valid, cached ? row_cache<A>(0, n) : nullptr);
  const Row<T, A> gs = stage_row(dy + offset, valid, cached ? row_cache<A>(1, n) : nullptr);
  A dot = 0;
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) dot += ys[i] * gs[i];
  dot = block_allreduce<SumOp<A>>(dot, scratch);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dx[offset + i] = static_cast<T>(i < valid ? scale * ys[i] * (gs[i] - dot) : A(0));
}

// Rows of up to 1024 elements run one warp each, eight warps per block.
constexpr int kWarpRowsPerBlock = 8;

// The calling warp's row, or -1 past the last row (the whole warp leaves).
__device__ __forceinline__ int64_t warp_row(int64_t rows) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  return row < rows ? row : -1;
}

// ---- Kernels with the row in registers as it was read: thread `rank` of
// the `count` that share a row holds packs rank, rank + count, ... of kVec
// elements of T (n a multiple of kVec), converted to A where used, and
// issues all of its loads of a row before the first reduction.

// Threads per row of the block-per-row register kernels at most: 4 packs
// each covers 8192 floats or 16384 bf16.
constexpr int kRowThreadsMax = 512;

// The threads that share a row: one warp (kWarpRows) or the whole block.
template <bool kWarpRows>
struct RowThreads {
  int64_t row;  // -1 past the last row (kernels that walk several rows set it)
  int rank, count;
  __device__ explicit RowThreads(int64_t rows)
      : row(kWarpRows ? warp_row(rows) : int64_t(blockIdx.x)),
        rank(kWarpRows ? threadIdx.x % kWarpSize : threadIdx.x),
        count(kWarpRows ? kWarpSize : blockDim.x) {}
  __device__ int group(int p) const { return p * count + rank; }
  template <typename Op, typename A>
  __device__ A allreduce(A value) const {
    if constexpr (kWarpRows) {
      return warp_allreduce<Op>(value);
    } else {
      __shared__ A scratch[kWarpSize];
      return block_allreduce<Op>(value, scratch);
    }
  }
};

template <bool kWarpRows>
constexpr int kRowThreadsBound = kWarpRows ? kWarpRowsPerBlock * kWarpSize : kRowThreadsMax;

// packs[p] = the thread's p-th pack of `row` if it is one of the first
// `whole`, zeros otherwise: predicated loads in one straight line.
template <bool kWarpRows, int kPacks, typename Pack>
__device__ __forceinline__ void load_packs(const RowThreads<kWarpRows>& threads, const Pack* row, int whole,
                                           Pack (&packs)[kPacks]) {
#pragma unroll
  for (int p = 0; p < kPacks; ++p) packs[p] = threads.group(p) < whole ? row[threads.group(p)] : Pack{};
}

// load_packs for a row of which only the first `valid` elements are read
// (causal rows): the one pack that `valid` cuts is read element-wise after.
template <bool kWarpRows, int kPacks, typename T, int kVec>
__device__ __forceinline__ void load_valid_packs(const RowThreads<kWarpRows>& threads, const T* row, int valid,
                                                 VecN<T, kVec> (&packs)[kPacks]) {
  load_packs(threads, reinterpret_cast<const VecN<T, kVec>*>(row), valid / kVec, packs);
  if (valid % kVec == 0) return;
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (threads.group(p) == valid / kVec)
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (threads.group(p) * kVec + j < valid) packs[p].elem[j] = row[threads.group(p) * kVec + j];
}

// The weight and bias packs are loaded with the x packs, so the output pass
// only computes and stores (float (8192, 768): 17.0 µs; the same kernel
// reading weight and bias after the statistics 18.1, staged in shared memory
// 19.4).
template <typename T, int kPacks, int kVec, bool kWarpRows>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>)
    layer_norm_forward_lanes_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                    const T* __restrict__ bias, T* __restrict__ y, opmath_t<T>* __restrict__ mean_out,
                                    opmath_t<T>* __restrict__ rstd_out, int64_t rows, int n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const RowThreads<kWarpRows> threads(rows);
  if (threads.row < 0) return;
  const int groups = n / kVec;
  Pack packs[kPacks], scales[kPacks], shifts[kPacks];
  load_packs(threads, reinterpret_cast<const Pack*>(x + threads.row * n), groups, packs);
  if (weight) load_packs(threads, reinterpret_cast<const Pack*>(weight), groups, scales);
  if (bias) load_packs(threads, reinterpret_cast<const Pack*>(bias), groups, shifts);
  A sum = 0;  // the zero packs past the end add nothing
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += static_cast<A>(packs[p].elem[j]);
  const A mean = threads.template allreduce<SumOp<A>>(sum) / static_cast<A>(n);
  A squares = 0;  // two passes: no cancellation in E[x^2] - mean^2
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (threads.group(p) < groups)
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A d = static_cast<A>(packs[p].elem[j]) - mean;
        squares += d * d;
      }
  const A rstd = rsqrt_acc(threads.template allreduce<SumOp<A>>(squares) / static_cast<A>(n) + eps);
  Pack* const out = reinterpret_cast<Pack*>(y + threads.row * n);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (threads.group(p) >= groups) continue;
    Pack result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A w = weight ? static_cast<A>(scales[p].elem[j]) : A(1);
      const A b = bias ? static_cast<A>(shifts[p].elem[j]) : A(0);
      result.elem[j] = static_cast<T>((static_cast<A>(packs[p].elem[j]) - mean) * rstd * w + b);
    }
    out[threads.group(p)] = result;
  }
  if (threads.rank == 0) {
    mean_out[threads.row] = mean;
    rstd_out[threads.row] = rstd;
  }
}

// Softmax (causal: `valid` = row % causal + 1 entries) with the row in
// registers; only the valid entries are read.
template <typename T, int kPacks, int kVec, bool kWarpRows>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>)
    softmax_forward_lanes_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n, int64_t causal,
                                 opmath_t<T> scale) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const RowThreads<kWarpRows> threads(rows);
  if (threads.row < 0) return;
  const int valid = causal ? static_cast<int>(threads.row % causal) + 1 : n;
  Pack packs[kPacks];
  load_valid_packs(threads, x + threads.row * n, valid, packs);
  const A scale2 = scale * static_cast<A>(kLog2e);
  auto for_each_valid = [&](auto&& f) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (threads.group(p) * kVec + j < valid) f(scale2 * static_cast<A>(packs[p].elem[j]));
  };
  A top = -std::numeric_limits<A>::infinity();
  for_each_valid([&](A v) { top = max_acc(top, v); });
  top = threads.template allreduce<MaxOp<A>>(top);
  A sum = 0;
  for_each_valid([&](A v) { sum += exp2_acc(v - top); });
  const A inv = A(1) / threads.template allreduce<SumOp<A>>(sum);
  Pack* const out = reinterpret_cast<Pack*>(y + threads.row * n);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int g = threads.group(p);
    if (g >= n / kVec) continue;
    Pack result;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      result.elem[j] =
          static_cast<T>(g * kVec + j < valid ? exp2_acc(scale2 * static_cast<A>(packs[p].elem[j]) - top) * inv : A(0));
    out[g] = result;
  }
}

// layer_norm dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy *
// weight, with x, dy and weight in registers; row group k (a warp, or a
// block) takes rows [k * rows_per_group, (k + 1) * rows_per_group). With
// `partial_w` each group also sums dy * xhat and dy over its rows into its
// own two row_cache() slots of shared memory, each column added to only by
// the thread that holds it, and the block writes one partial row each of
// partial_w/partial_b[blockIdx.x] (warps: their slots folded in warp order,
// so the sums are bitwise reproducible): x and dy are read once for all
// three gradients, with no atomics.
template <typename T, int kPacks, int kVec, bool kWarpRows>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>)
    layer_norm_backward_lanes_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const opmath_t<T>* __restrict__ mean, const opmath_t<T>* __restrict__ rstd,
                                     const T* __restrict__ weight, T* __restrict__ dx,
                                     opmath_t<T>* __restrict__ partial_w, opmath_t<T>* __restrict__ partial_b,
                                     int64_t rows, int n, int64_t rows_per_group) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  using Sums = VecN<A, kVec>;
  RowThreads<kWarpRows> threads(rows);
  const int groups = n / kVec;
  const int slot = kWarpRows ? threadIdx.x / kWarpSize : 0;
  const int slots = kWarpRows ? blockDim.x / kWarpSize : 1;
  Sums* const sums_w = reinterpret_cast<Sums*>(row_cache<A>(slot, n));
  Sums* const sums_b = reinterpret_cast<Sums*>(row_cache<A>(slots + slot, n));
  const bool params = partial_w != nullptr;
  if (params)
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (threads.group(p) < groups) sums_w[threads.group(p)] = sums_b[threads.group(p)] = Sums{};
  Pack scales[kPacks];
  if (weight) load_packs(threads, reinterpret_cast<const Pack*>(weight), groups, scales);
  const int64_t group_index = kWarpRows ? blockIdx.x * int64_t(slots) + slot : blockIdx.x;
  const int64_t first = group_index * rows_per_group;
  const int64_t last = first + rows_per_group < rows ? first + rows_per_group : rows;
  for (threads.row = first; threads.row < last; ++threads.row) {
    Pack xs[kPacks], gs[kPacks];
    load_packs(threads, reinterpret_cast<const Pack*>(x + threads.row * n), groups, xs);
    load_packs(threads, reinterpret_cast<const Pack*>(dy + threads.row * n), groups, gs);
    const A mu = mean[threads.row], r = rstd[threads.row];
    auto xhat_at = [&](int p, int j) { return (static_cast<A>(xs[p].elem[j]) - mu) * r; };
    auto g_at = [&](int p, int j) {
      return weight ? static_cast<A>(gs[p].elem[j]) * static_cast<A>(scales[p].elem[j])
                    : static_cast<A>(gs[p].elem[j]);
    };
    A sum_g = 0, sum_gx = 0;  // zero packs past the end add nothing
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        sum_g += g_at(p, j);
        sum_gx += g_at(p, j) * xhat_at(p, j);
      }
    const A mean_g = threads.template allreduce<SumOp<A>>(sum_g) / static_cast<A>(n);
    const A mean_gx = threads.template allreduce<SumOp<A>>(sum_gx) / static_cast<A>(n);
    Pack* const out = reinterpret_cast<Pack*>(dx + threads.row * n);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = threads.group(p);
      if (g >= groups) continue;
      Pack result;
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        result.elem[j] = static_cast<T>(r * (g_at(p, j) - mean_g - xhat_at(p, j) * mean_gx));
      out[g] = result;
      if (params) {
        Sums w = sums_w[g], b = sums_b[g];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          w.elem[j] += static_cast<A>(gs[p].elem[j]) * xhat_at(p, j);
          b.elem[j] += static_cast<A>(gs[p].elem[j]);
        }
        sums_w[g] = w;
        sums_b[g] = b;
      }
    }
  }
  if (!params) return;
  if constexpr (kWarpRows) {
    __syncthreads();
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
      A total_w = 0, total_b = 0;
      for (int k = 0; k < slots; ++k) {
        total_w += row_cache<A>(k, n)[c];
        total_b += row_cache<A>(slots + k, n)[c];
      }
      partial_w[blockIdx.x * int64_t(n) + c] = total_w;
      partial_b[blockIdx.x * int64_t(n) + c] = total_b;
    }
  } else {
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (threads.group(p) < groups) {
        reinterpret_cast<Sums*>(partial_w + blockIdx.x * int64_t(n))[threads.group(p)] = sums_w[threads.group(p)];
        reinterpret_cast<Sums*>(partial_b + blockIdx.x * int64_t(n))[threads.group(p)] = sums_b[threads.group(p)];
      }
  }
}

// dx = scale * y * (dy - sum(y * dy)) over the valid entries, zeros after,
// with y and dy in registers.
template <typename T, int kPacks, int kVec, bool kWarpRows>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>)
    softmax_backward_lanes_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                  int64_t rows, int n, int64_t causal, opmath_t<T> scale) {
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const RowThreads<kWarpRows> threads(rows);
  if (threads.row < 0) return;
  const int valid = causal ? static_cast<int>(threads.row % causal) + 1 : n;
  Pack ys[kPacks], gs[kPacks];
  load_valid_packs(threads, y + threads.row * n, valid, ys);
  load_valid_packs(threads, dy + threads.row * n, valid, gs);
  A dot = 0;  // entries past `valid` are zero packs
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
#pragma unroll
    for (int j = 0; j < kVec; ++j) dot += static_cast<A>(ys[p].elem[j]) * static_cast<A>(gs[p].elem[j]);
  dot = threads.template allreduce<SumOp<A>>(dot);
  Pack* const out = reinterpret_cast<Pack*>(dx + threads.row * n);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (threads.group(p) >= n / kVec) continue;
    Pack result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A product = scale * static_cast<A>(ys[p].elem[j]) * (static_cast<A>(gs[p].elem[j]) - dot);
      result.elem[j] = static_cast<T>(threads.group(p) * kVec + j < valid ? product : A(0));
    }
    out[threads.group(p)] = result;
  }
}

// ---- Forward kernels for short rows: one warp per row, the row staged in
// the warp's slice of shared memory with cp.async. No registers are held
// while the loads are in flight, so occupancy is set by shared memory (48-64
// warps per SM) instead of by a row in registers (16-24): three times the
// bytes in flight (softmax bf16 (98304, 1024): 158 -> 131 µs).
// Loops go over groups of kVec elements: 16-byte packs when every row of
// every buffer is 16-byte aligned and n a multiple of the pack, else 1.

__device__ __forceinline__ void copy16_async(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
#else
  *static_cast<uint4*>(shared) = *static_cast<const uint4*>(global);
#endif
}

__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Copies row[0, count) into the warp's `stage` and returns once every lane's
// copies have landed: whole packs asynchronously, the rest element-wise.
template <int kVec, typename T>
__device__ __forceinline__ void stage_warp_row(T* stage, const T* row, int count) {
  const int lane = threadIdx.x % kWarpSize;
  int done = 0;
  if constexpr (kVec > 1) {
    done = count / kVec * kVec;
    for (int i = lane * kVec; i < done; i += kWarpSize * kVec) copy16_async(stage + i, row + i);
  }
  for (int i = done + lane; i < count; i += kWarpSize) stage[i] = row[i];
  wait_async_copies();
  __syncwarp();
}

// f(stage[i]) for the lane's elements i < count (count <= the row length):
// whole groups without per-element checks, then the one partial group of a
// causal row. Offsets within a row are int: short rows only.
template <int kVec, typename A, typename T, typename F>
__device__ __forceinline__ void for_each_staged(const T* stage, int count, F&& f) {
  const int lane = threadIdx.x % kWarpSize;
  const int groups = count / kVec;
  for (int g = lane; g < groups; g += kWarpSize) {
    const VecN<T, kVec> pack = reinterpret_cast<const VecN<T, kVec>*>(stage)[g];
#pragma unroll
    for (int j = 0; j < kVec; ++j) f(static_cast<A>(pack.elem[j]));
  }
  if (lane == groups % kWarpSize)
    for (int i = groups * kVec; i < count; ++i) f(static_cast<A>(stage[i]));
}

// out[i .. i + kVec) = f(i, v) for the lane's groups of [0, n), where v holds
// stage[i .. i + kVec) and f rewrites it in place. Stores are kVec wide.
template <int kVec, typename A, typename T, typename F>
__device__ __forceinline__ void map_staged(const T* stage, T* out, int n, F&& f) {
  for (int first = (threadIdx.x % kWarpSize) * kVec; first < n; first += kWarpSize * kVec) {
    const VecN<T, kVec> pack = *reinterpret_cast<const VecN<T, kVec>*>(stage + first);
    A v[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = static_cast<A>(pack.elem[j]);
    f(first, v);
    VecN<T, kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) result.elem[j] = static_cast<T>(v[j]);
    *reinterpret_cast<VecN<T, kVec>*>(out + first) = result;
  }
}

// v[j] = op(v[j], params[first + j]) for a group, read as one kVec-wide load.
template <int kVec, typename A, typename T, typename Op>
__device__ __forceinline__ void apply_params(const T* params, int64_t first, A (&v)[kVec], Op op) {
  const VecN<T, kVec> pack = *reinterpret_cast<const VecN<T, kVec>*>(params + first);
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = op(v[j], static_cast<A>(pack.elem[j]));
}

// Eight blocks of eight warps per SM (32 registers): 64 warps, so up to
// 132 * 64 rows are in flight at once and (8192, 768) runs as one wave rather
// than 1.3 (40 registers: 48 warps per SM). Double would spill at 32.
template <typename T>
constexpr int kStagedMinBlocks = sizeof(T) <= 4 ? 8 : 4;

template <typename T, int kVec>
__global__ void __launch_bounds__(kWarpRowsPerBlock* kWarpSize, kStagedMinBlocks<T>)
    layer_norm_forward_warp_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                   T* __restrict__ y, opmath_t<T>* __restrict__ mean_out,
                                   opmath_t<T>* __restrict__ rstd_out, int64_t rows, int n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  const int64_t row = warp_row(rows);
  if (row < 0) return;
  T* const stage = row_cache<T>(threadIdx.x / kWarpSize, n);  // the warp's slot
  stage_warp_row<kVec>(stage, x + row * n, n);
  A sum = 0;
  for_each_staged<kVec, A>(stage, n, [&](A v) { sum += v; });
  const A mean = warp_allreduce<SumOp<A>>(sum) / static_cast<A>(n);
  A squares = 0;  // two passes: no cancellation in E[x^2] - mean^2
  for_each_staged<kVec, A>(stage, n, [&](A v) { squares += (v - mean) * (v - mean); });
  const A rstd = rsqrt_acc(warp_allreduce<SumOp<A>>(squares) / static_cast<A>(n) + eps);
  map_staged<kVec, A>(stage, y + row * n, n, [&](int first, A(&v)[kVec]) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = (v[j] - mean) * rstd;
    if (weight) apply_params(weight, first, v, [](A a, A w) { return a * w; });
    if (bias) apply_params(bias, first, v, [](A a, A b) { return a + b; });
  });
  if (threadIdx.x % kWarpSize == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// NaN needs no special care: it makes the sum, and so the whole row, NaN, as in torch.
template <typename T, int kVec>
__global__ void __launch_bounds__(kWarpRowsPerBlock* kWarpSize, kStagedMinBlocks<T>)
    softmax_forward_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n, int64_t causal,
                                opmath_t<T> scale) {
  using A = opmath_t<T>;
  const int64_t row = warp_row(rows);
  if (row < 0) return;
  const int valid = causal ? static_cast<int>(row % causal) + 1 : n;
  T* const stage = row_cache<T>(threadIdx.x / kWarpSize, n);  // the warp's slot
  stage_warp_row<kVec>(stage, x + row * n, valid);
  const A scale2 = scale * static_cast<A>(kLog2e);
  A top = -std::numeric_limits<A>::infinity();
  for_each_staged<kVec, A>(stage, valid, [&](A v) { top = max_acc(top, scale2 * v); });
  top = warp_allreduce<MaxOp<A>>(top);
  A sum = 0;
  for_each_staged<kVec, A>(stage, valid, [&](A v) { sum += exp2_acc(scale2 * v - top); });
  const A inv = A(1) / warp_allreduce<SumOp<A>>(sum);
  map_staged<kVec, A>(stage, y + row * n, n, [&](int first, A(&v)[kVec]) {
    if (first + kVec <= valid) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = exp2_acc(scale2 * v[j] - top) * inv;
    } else if (first >= valid) {  // above the diagonal
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = A(0);
    } else {  // the diagonal's group
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = first + j < valid ? exp2_acc(scale2 * v[j] - top) * inv : A(0);
    }
  });
}

}  // namespace fastreduce
