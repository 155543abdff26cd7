// layer_norm and rms_norm of rows past one warp that are not whole 16-byte
// packs (odd widths: 4095, 8191), one block a row in registers: x, y, dy and
// dx are read and written as loose rows (row_io.cuh's PackedRow: whole packs
// from each row's first 16-byte boundary, the few elements around them one
// each), so each row still moves in 16-byte packs. A row's packs start at a
// different column from row to row, so the weight and bias, which every row
// reads from column 0, are read as the 16-byte blocks around each of the
// row's packs, shifted into place (row_io.cuh's ShiftedParams and
// load_shifted; from L1: every block reads them). No residual: the launcher
// adds it in a pass first. The forwards of rows past 4096 (bf16 layer_norm's
// past 8192) are read twice instead (norm_forward_reread_kernel's kLoose).
#pragma once

#include "norm_kernels.cuh"

namespace fastreduce {

// The loose rows' columns a thread holds: element j of its p-th pack lies at
// column packs_at(p) + j, its loose element at loose.index.
template <typename T, bool kWarpRows>
struct LooseColumns {
  static constexpr int kVec = Vec16<T>::kSize;
  PackedRow<kVec, true> layout;
  const RowThreads<kWarpRows>& threads;
  __device__ LooseColumns(const T* row, int n, const RowThreads<kWarpRows>& threads)
      : layout(row, n, threads.rank), threads(threads) {}
  __device__ bool in_row(int p) const { return threads.group(p) < layout.packs; }
  __device__ int packs_at(int p) const { return layout.head + threads.group(p) * kVec; }
};

// Stores kVec results rounded to T as one pack (words_of: two-byte fields
// two at a time). Double rows never come here (loose_row_threads), but compile.
template <typename T, typename A, int kVec>
__device__ __forceinline__ void store_pack(Vec16<T>* out, const A (&v)[kVec]) {
  if constexpr (std::is_same_v<A, float>) {
    *reinterpret_cast<uint4*>(out) = words_of<T>(v);  // a memcpy here was 16 byte stores
  } else {
    Vec16<T> pack;
#pragma unroll
    for (int j = 0; j < kVec; ++j) pack.elem[j] = static_cast<T>(v[j]);
    *out = pack;
  }
}

// The forward: y, and the row's mean (layer_norm) and rstd. kAffine: every
// parameter given (no test of their pointers). Two blocks of kRowThreadsMax
// an SM (64 registers): NVVM loads every pack's parameters up front, and at
// 77-86 registers the SM held too few rows (H200, events, bf16 layer_norm
// (8192, 4095) 48.4 µs, 41.4 with the bound; NOTES).
template <typename T, int kPacks, typename Math, typename P = T, bool kAffine = false>
__global__ void __launch_bounds__(kRowThreadsMax, 2) norm_forward_loose_kernel(NormForwardArgs<T, P> a) {
  constexpr bool kCentered = Math::kCentered;
  const bool weighted = kAffine || a.weight, biased = kCentered && (kAffine || a.bias);
  constexpr int kVec = Vec16<T>::kSize;
  using A = opmath_t<T>;
  using Pack = Vec16<T>;
  const RowThreads<false> threads(a.rows);
  const int n = static_cast<int>(a.n);
  const T* const x = a.x + threads.row * a.n;
  T* const y = a.y + threads.row * a.n;
  const LooseColumns<T, false> columns(x, n, threads);
  const auto& layout = columns.layout;
  Pack packs[kPacks];
  load_packs<sizeof(T) == 2>(threads, layout.packs_of(x), layout.packs, packs);
  const A spare = layout.loose_of(x);
  const A shift = kCentered ? static_cast<A>(x[0]) : A(0);
  A mean;
  const A rstd = row_rstd<kCentered>(
      n, a.eps, shift,
      [&](auto f) {
#pragma unroll
        for (int p = 0; p < kPacks; ++p)
          if (columns.in_row(p))
#pragma unroll
            for (int j = 0; j < kVec; ++j) f(element(packs[p], j));
        if (layout.loose.held) f(spare);
      },
      [&](auto v) { return threads.template allreduce<SumOp<decltype(v)>>(v); }, mean);
  const RowNormalizer<T, A> normalize(mean, rstd);
  Pack* const out = layout.packs_of(y);
  const auto write = [&](auto weight_at, auto bias_at) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (!columns.in_row(p)) continue;
      const int g = threads.group(p);
      const auto w = weighted ? weight_at(g) : VecN<P, kVec>{};
      const auto b = biased ? bias_at(g) : VecN<P, kVec>{};
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result[j] = normalize(element(packs[p], j));
        if (weighted) result[j] *= element<P, kVec, A>(w, j);
        if (biased) result[j] += element<P, kVec, A>(b, j);
      }
      store_pack<T>(&out[g], result);
    }
  };
  with_loose_params<P, kVec>(a.weight, a.bias, layout.head, weighted, biased, write);
  if (layout.loose.held) {
    const int64_t i = layout.loose.index;
    A v = normalize(spare);
    if (weighted) v *= static_cast<A>(a.weight[i]);
    if (biased) v += static_cast<A>(a.bias[i]);
    y[i] = static_cast<T>(v);
  }
  if (threads.rank == 0) {
    if constexpr (kCentered) a.mean[threads.row] = mean;
    a.rstd[threads.row] = rstd;
  }
}

// Rows this far apart start equally far from a 16-byte boundary, so their
// packs hold the same columns: 16 bytes over the gcd of 16 and a row's bytes.
template <typename T>
__host__ __device__ constexpr int loose_row_period(int64_t n) {
  int period = 16;
  while (n * int64_t(sizeof(T)) % period != 0) period /= 2;
  return 16 / period;
}

// dx, and with `partial_w` the weight and bias gradients' partial rows. Block
// k takes rows_per_group rows of one class of rows loose_row_period apart
// (class k % period, its (k / period)-th run of them: row k itself where
// rows_per_group is 1), so each thread holds the same columns in every row
// it takes and sums dy * xhat (and dy) for them in its own shared-memory
// slots, as norm_backward_lanes_kernel; then the block writes one partial
// row of each. No atomics: the sums are bitwise reproducible.
template <typename T, int kPacks, typename Math, typename P = T>
__global__ void __launch_bounds__(kRowThreadsMax) norm_backward_loose_kernel(NormBackwardArgs<T, P> a) {
  constexpr bool kCentered = Math::kCentered;
  constexpr int kVec = Vec16<T>::kSize;
  using A = opmath_t<T>;
  using Pack = Vec16<T>;
  using Sums = VecN<A, kVec>;
  using WeightPack = VecN<P, kVec>;
  RowThreads<false> threads(a.rows);
  const int n = static_cast<int>(a.n);
  const bool params = a.partial_w != nullptr, bias = a.partial_b != nullptr;
  Sums* const sums_w = reinterpret_cast<Sums*>(row_cache<A>(0, 0));
  Sums* const sums_b = sums_w + kPacks * blockDim.x;
  A loose_w = 0, loose_b = 0;
  if (params)
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      sums_w[threads.local(p)] = Sums{};
      if (bias) sums_b[threads.local(p)] = Sums{};
    }
  const int64_t period = loose_row_period<T>(n);
  const int64_t first = blockIdx.x % period + period * (blockIdx.x / period * a.rows_per_group);
  const int64_t last = min(a.rows, first + period * a.rows_per_group);
  // The columns are the same in every row taken: those of the first (the
  // partial rows are written by them when the block takes no row).
  const LooseColumns<T, false> columns(a.x + first * a.n, n, threads);
  const auto& layout = columns.layout;
  // g = dy * weight, the weight as the row's packs (load_shifted): shifted
  // once a block into the thread's own slots after the sums' where the block
  // takes a run of rows (its columns are the same in each), else per row.
  WeightPack* const weights =
      params ? reinterpret_cast<WeightPack*>(bias ? sums_b + kPacks * blockDim.x : sums_b) : nullptr;
  // With a.prefetch, the next row's x and dy packs are copied into the slots
  // after those while this row's dx is written (its loads would wait for
  // them otherwise: the kernel was latency-bound, NOTES; stage_packs).
  Pack* const stage_x = reinterpret_cast<Pack*>(weights + kPacks * blockDim.x);
  Pack* const stage_dy = stage_x + kPacks * blockDim.x;
  const auto stage_row = [&](int64_t row) {
    stage_packs<kPacks>(threads, layout.packs, layout.packs_of(a.x + row * a.n), stage_x,
                        layout.packs_of(a.dy + row * a.n), stage_dy);
  };
  if (a.prefetch && first < last) stage_row(first);
  if (weights && a.weight)
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (columns.in_row(p)) weights[threads.local(p)] = load_shifted<P, kVec>(a.weight + columns.packs_at(p));
  const auto weight_of = [&](int p) {
    if (!a.weight) return WeightPack{};
    return weights ? weights[threads.local(p)] : load_shifted<P, kVec>(a.weight + columns.packs_at(p));
  };
  const A loose_weight = a.weight && layout.loose.held ? static_cast<A>(a.weight[layout.loose.index]) : A(1);
  for (threads.row = first; threads.row < last; threads.row += period) {
    const int64_t offset = threads.row * a.n;
    const T* const x = a.x + offset;
    const T* const dy = a.dy + offset;
    Pack xs[kPacks], gs[kPacks];
    if (a.prefetch) {
      wait_async_copies();
      load_staged_packs(threads, stage_x, layout.packs, xs);
      load_staged_packs(threads, stage_dy, layout.packs, gs);
    } else {
      load_packs(threads, layout.packs_of(x), layout.packs, xs);
      load_packs(threads, layout.packs_of(dy), layout.packs, gs);
    }
    const A spare_x = layout.loose_of(x), spare_dy = layout.loose_of(dy);
    const A mu = row_mean<kCentered>(a.mean, threads.row), r = a.rstd[threads.row];
    const auto g_of = [&](const Pack& dys, const VecN<P, kVec>& w, int j) {
      return a.weight ? element(dys, j) * element<P, kVec, A>(w, j) : element(dys, j);
    };
    const A spare_g = spare_dy * loose_weight;
    A sum_g = 0, sum_gx = 0;
    const auto add = [&](A x_value, A g) {
      sum_g += g;
      sum_gx += g * (x_value - mu) * r;
    };
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (columns.in_row(p)) {
        const auto w = weight_of(p);
#pragma unroll
        for (int j = 0; j < kVec; ++j) add(element(xs[p], j), g_of(gs[p], w, j));
      }
    if (layout.loose.held) add(spare_x, spare_g);
    A mean_g = 0, mean_gx;
    if constexpr (kCentered) {
      const GradientSums<A> row =
          threads.template allreduce<SumOp<GradientSums<A>>>(GradientSums<A>{sum_g, sum_gx});
      mean_g = row.g / static_cast<A>(n);
      mean_gx = row.gx / static_cast<A>(n);
    } else {
      mean_gx = threads.template allreduce<SumOp<A>>(sum_gx) / static_cast<A>(n);
    }
    if (a.prefetch && threads.row + period < last) stage_row(threads.row + period);
    const auto dx_of = [&](A x_value, A g) { return r * (g - mean_g - (x_value - mu) * r * mean_gx); };
    T* const dx = a.dx + offset;
    const T* const carried = a.grad_residual ? a.grad_residual + offset : nullptr;
    Pack* const out = layout.packs_of(dx);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (!columns.in_row(p)) continue;
      const int g = threads.group(p);
      const Pack residual = carried ? layout.packs_of(carried)[g] : Pack{};
      const auto w = weight_of(p);
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        result[j] = dx_of(element(xs[p], j), g_of(gs[p], w, j));
        if (carried) result[j] += element(residual, j);
      }
      store_pack<T>(&out[g], result);
      if (params) {
        Sums w = sums_w[threads.local(p)];
#pragma unroll
        for (int j = 0; j < kVec; ++j) w.elem[j] += element(gs[p], j) * (element(xs[p], j) - mu) * r;
        sums_w[threads.local(p)] = w;
        if (bias) {
          Sums b = sums_b[threads.local(p)];
#pragma unroll
          for (int j = 0; j < kVec; ++j) b.elem[j] += element(gs[p], j);
          sums_b[threads.local(p)] = b;
        }
      }
    }
    if (layout.loose.held) {
      const int64_t i = layout.loose.index;
      A v = dx_of(spare_x, spare_g);
      if (carried) v += static_cast<A>(carried[i]);
      dx[i] = static_cast<T>(v);
      loose_w += spare_dy * (spare_x - mu) * r;
      loose_b += spare_dy;
    }
  }
  if (!params) return;
  A* const partial_w = a.partial_w + blockIdx.x * a.n;
  A* const partial_b = bias ? a.partial_b + blockIdx.x * a.n : nullptr;
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
    if (columns.in_row(p))
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        partial_w[columns.packs_at(p) + j] = sums_w[threads.local(p)].elem[j];
        if (bias) partial_b[columns.packs_at(p) + j] = sums_b[threads.local(p)].elem[j];
      }
  if (layout.loose.held) {
    partial_w[layout.loose.index] = loose_w;
    if (bias) partial_b[layout.loose.index] = loose_b;
  }
}

}  // namespace fastreduce
