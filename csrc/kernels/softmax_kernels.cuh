// Softmax (plain and GPT-2 causal), forward and backward, in the three row
// shapes of row_io.cuh.
#pragma once

#include "row_io.cuh"
#include "row_math.cuh"

namespace fastreduce {

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
  const Row<T, A> row = stage_row(x + offset, valid, cached ? stage_slot<A>(0, n) : nullptr);
  const A scale2 = scale * static_cast<A>(kLog2e);
  A top = MaxOp<A>::identity();
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) top = MaxOp<A>::combine(top, scale2 * row[i]);
  top = block_allreduce<MaxOp<A>>(top, scratch);
  auto normalise = [&](auto exp_of) {
    A sum = 0;
    for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) sum += exp_of(row[i]);
    const A inv = A(1) / block_allreduce<SumOp<A>>(sum, scratch);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      y[offset + i] = static_cast<T>(i < valid ? exp_of(row[i]) * inv : A(0));
  };
  if (fma_shift_in_range(top)) {
    normalise([&](A v) { return exp2_acc(scale2 * v - top); });
  } else {
    A top_natural = MaxOp<A>::identity();
    for (int64_t i = threadIdx.x; i < valid; i += blockDim.x)
      top_natural = MaxOp<A>::combine(top_natural, mul_rn(scale, row[i]));
    top_natural = block_allreduce<MaxOp<A>>(top_natural, scratch);
    normalise([&](A v) { return exp_shifted(mul_rn(scale, v), top_natural); });
  }
}

// dx = scale * y * (dy - sum(y * dy)) over the valid entries, zeros after.
template <typename T>
__global__ void softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                        int64_t n, int64_t causal, opmath_t<T> scale, bool cached) {
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t offset = blockIdx.x * n;
  const int64_t valid = causal ? blockIdx.x % causal + 1 : n;
  const Row<T, A> ys = stage_row(y + offset, valid, cached ? stage_slot<A>(0, n) : nullptr);
  const Row<T, A> gs = stage_row(dy + offset, valid, cached ? stage_slot<A>(1, n) : nullptr);
  A dot = 0;
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) dot += ys[i] * gs[i];
  dot = block_allreduce<SumOp<A>>(dot, scratch);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dx[offset + i] = static_cast<T>(i < valid ? scale * ys[i] * (gs[i] - dot) : A(0));
}

// Softmax with the row in registers, converted to A once and overwritten by
// its exponentials, so each element costs one exp2 (a second pass of exp2 and
// conversions cost 10-25% at rows of 1600-8192 bf16: bench/micro/softmax_rows).
// kCausal: row % causal + 1 entries are valid and only they are read.
// kWalk (block rows in clusters of kWalkClusterMin, as the norm forward's):
// fewer row groups than rows are launched, group k taking rows k, k + G, ...
// kLoose: plain rows that are not whole packs (PackedRow), a loose element
// in the first threads' `spare`. kThreads: the most threads a block
// (kWideRowThreads for the widest one-block rows).
template <typename T, int kPacks, int kVec, bool kWarpRows, bool kCausal, bool kWalk = false, bool kLoose = false,
          int kThreads = kRowThreadsBound<kWarpRows>>
__global__ void __launch_bounds__(kThreads)
    softmax_forward_lanes_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n, int64_t causal,
                                 opmath_t<T> scale) {
  static_assert(!kWalk || !kWarpRows, "block rows walk");
  static_assert(!kLoose || !kCausal, "causal rows are read up to their diagonal");
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  // One reduction (below) in rows of two-byte packs only. In float rows it
  // cost 2-30% (H200, the launcher: f32 (8192, 4096) 65.2 -> 67.4 µs, (512,
  // 262144) 279.9 -> 364.8); with the maximum beside the sum it spilled the
  // causal walk and slowed rows of one element a load (bf16 1000 wide: 12.2
  // -> 12.4 µs).
  constexpr bool kOneReduction = sizeof(T) == 2 && kVec > 1 && !kCausal;
  RowThreads<kWarpRows> threads(rows);
  if (threads.row < 0) return;
  const int64_t row_groups = gridDim.x / cluster_blocks();
  for (;; threads.row += row_groups) {
    if constexpr (kWalk) {
      if (threads.row >= rows) break;
      // Addresses recomputed each row (as the norm forward's walk).
      asm volatile("" : "+r"(threads.rank), "+r"(threads.count));
    }
    const int valid = kCausal ? static_cast<int>(threads.row % causal) + 1 : n;
    const T* const in = x + threads.row * n;
    const PackedRow<kVec, kLoose> layout(in, n, threads.rank);
    A v[kPacks][kVec], spare;
    auto load_row = [&] {
      Pack packs[kPacks];
      if constexpr (kCausal) load_valid_packs(threads, in, valid, packs);
      else load_packs(threads, layout.packs_of(in), layout.packs, packs);
      spare = layout.loose_of(in);
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[p][j] = static_cast<A>(packs[p].elem[j]);
    };
    load_row();
    auto in_row = [&](int p, int j) {
      return kCausal ? threads.group(p) * kVec + j < valid : threads.group(p) < layout.packs;
    };
    auto for_each_valid = [&](auto&& f) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (in_row(p, j)) f(v[p][j]);
      if (kLoose && layout.loose.held) f(spare);
    };
    auto map_row = [&](auto&& f) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[p][j] = f(v[p][j]);
      if constexpr (kLoose) spare = f(spare);
    };
    const A scale2 = scale * static_cast<A>(kLog2e);
    A inv;
    bool normalised = false;
    if constexpr (kOneReduction) {
      // The exponentials against the row's first value (lane 0's in a warp
      // row, a load every thread shares in a block row) and their sum,
      // which bounds every one of them. Past kShiftedSumMax, the row again,
      // against its largest value.
      const A shift = scale2 * (kWarpRows ? __shfl_sync(kFullMask, v[0][0], 0) : static_cast<A>(in[0]));
      if (fma_shift_in_range(shift)) {  // the same in every thread of the row
        map_row([&](A e) { return exp2_acc(scale2 * e - shift); });
        A mine = 0;
        for_each_valid([&](A e) { mine += e; });
        const A total = threads.template allreduce<SumOp<A>>(mine);
        normalised = total <= A(kShiftedSumMax);  // false for inf and NaN
        inv = A(1) / total;
      }
      if (!normalised) load_row();
    }
    if (!normalised) {
      A top = -std::numeric_limits<A>::infinity();
      for_each_valid([&](A e) { top = max_acc(top, scale2 * e); });
      top = threads.template allreduce<MaxOp<A>>(top);
      if (fma_shift_in_range(top)) {
        map_row([&](A e) { return exp2_acc(scale2 * e - top); });
      } else {
        A top_natural = -std::numeric_limits<A>::infinity();
        for_each_valid([&](A e) { top_natural = max_acc(top_natural, mul_rn(scale, e)); });
        top_natural = threads.template allreduce<MaxOp<A>>(top_natural);
        map_row([&](A e) { return exp_shifted(mul_rn(scale, e), top_natural); });
      }
      A sum = 0;
      for_each_valid([&](A e) { sum += e; });
      inv = A(1) / threads.template allreduce<SumOp<A>>(sum);
    }
    T* const row_out = y + threads.row * n;
    Pack* const out = layout.packs_of(row_out);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = threads.group(p);
      if (g >= layout.packs) continue;
      Pack result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) result.elem[j] = static_cast<T>(!kCausal || in_row(p, j) ? v[p][j] * inv : A(0));
      out[g] = result;
    }
    if (kLoose && layout.loose.held) row_out[layout.loose.index] = static_cast<T>(spare * inv);
    if constexpr (!kWalk) break;
  }
}

// Plain rows of 16-byte packs split over a cluster, walking (cluster k takes
// rows k, k + G, ...). A block holds its share of a row as the words it read
// and recomputes each exponential in the output pass, so its share of the
// next row fits beside it: those loads are issued while the row's sums are
// in flight between the blocks. H200 (bench/micro/pipelined_softmax), µs,
// against the kernel above (four packs a thread, whose exchanges other
// blocks' loads must cover): bf16 (512, 262144) 175.6 -> 148.8, (1024,
// 131072) 163.7 -> 140.9, (4096, 32768) 145.6 -> 139.2; float32 (512,
// 131072) 152.5 -> 134.7, (2048, 32768) 137.9 -> 133.3. The rare rows the
// first value cannot shift are read again from memory, a pack at a time:
// held in registers, their passes tripled the code and cost 10%. kLoose:
// rows that are not whole packs (PackedRow).
template <typename T, int kPacks, bool kLoose>
__global__ void __launch_bounds__(kRowThreadsMax)
    softmax_forward_pipelined_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n,
                                     opmath_t<T> scale) {
  static_assert(std::is_same_v<opmath_t<T>, float>, "two- or four-byte elements");
  constexpr int kVec = Vec16<T>::kSize;
  using A = float;
  using Pack = uint4;  // kVec elements as words (word_element)
  RowThreads<false> threads(rows);
  const A scale2 = scale * static_cast<A>(kLog2e);
  walk_pipelined<kPacks, kLoose>(threads, rows, n, n, {x}, [&](int64_t row, const auto& shares, auto&& fetch_next) {
    const Pack(&packs)[kPacks] = shares.words[0];
    const PackedRow<kVec, kLoose> layout(x + row * n, n, threads.rank);
    const int groups = layout.packs;
    const bool loose = kLoose && layout.loose.held;
    const A spare = low_element<T>(shares.spare[0]);
    const Pack* const in = reinterpret_cast<const Pack*>(layout.packs_of(x + row * n));
    Pack* const out = reinterpret_cast<Pack*>(layout.packs_of(y + row * n));
    T* const loose_out = y + row * n + layout.loose.index;
    // The exponentials against the first value of the row's packs (loaded
    // with them: RowShares::head) and their sum, the next row's loads in
    // flight during its exchange. No maximum: a sum of at most
    // kShiftedSumMax bounds every exponential (H200, bf16 (512, 262144)
    // 147.6 -> 144.0 µs).
    const A shift = scale2 * low_element<T>(shares.head);
    const A mine = shifted_exp_sum<T>(threads, packs, groups, loose, spare, scale2, shift);
    const A total = threads.template allreduce<SumOp<A>>(mine, fetch_next);
    // The same in every block of the cluster, so all make the same exchanges.
    if (fma_shift_in_range(shift) && total <= A(kShiftedSumMax)) {  // false for inf and NaN
      const A inv = A(1) / total;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (threads.group(p) >= groups) continue;
        A result[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) result[j] = exp2_acc(scale2 * word_element<T>(packs[p], j) - shift) * inv;
        out[threads.group(p)] = words_of<T>(result);
      }
      if (loose) *loose_out = static_cast<T>(exp2_acc(scale2 * spare - shift) * inv);
    } else {
      // Some value is far above the first, or either is not finite or
      // past 2^24 (rare): the row again, from memory, against its maximum
      // (as softmax_forward_lanes_kernel's).
      const auto for_each = [&](auto&& f) {
#pragma unroll 1
        for (int g = threads.rank; g < groups; g += threads.count) {
          const Pack pack = in[g];
#pragma unroll
          for (int j = 0; j < kVec; ++j) f(word_element<T>(pack, j));
        }
        if (loose) f(spare);
      };
      const auto write = [&](auto&& exp_of, A inv) {
#pragma unroll 1
        for (int g = threads.rank; g < groups; g += threads.count) {
          const Pack pack = in[g];
          A result[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) result[j] = exp_of(word_element<T>(pack, j)) * inv;
          out[g] = words_of<T>(result);
        }
        if (loose) *loose_out = static_cast<T>(exp_of(spare) * inv);
      };
      A top = -std::numeric_limits<A>::infinity();
      for_each([&](A e) { top = max_acc(top, scale2 * e); });
      top = threads.template allreduce<MaxOp<A>>(top);
      const bool natural = !fma_shift_in_range(top);
      if (natural) {
        top = -std::numeric_limits<A>::infinity();
        for_each([&](A e) { top = max_acc(top, mul_rn(scale, e)); });
        top = threads.template allreduce<MaxOp<A>>(top);
      }
      const auto exp_of = [&](A e) {
        return natural ? exp_shifted(mul_rn(scale, e), top) : exp2_acc(scale2 * e - top);
      };
      A sum = 0;
      for_each([&](A e) { sum += exp_of(e); });
      write(exp_of, A(1) / threads.template allreduce<SumOp<A>>(sum));
    }
  });
}

// dx = scale * y * (dy - sum(y * dy)) over the valid entries (kCausal,
// kLoose as above), zeros after, with y and dy in registers.
template <typename T, int kPacks, int kVec, bool kWarpRows, bool kCausal, bool kLoose = false>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>)
    softmax_backward_lanes_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                  int64_t rows, int n, int64_t causal, opmath_t<T> scale) {
  static_assert(!kLoose || !kCausal, "causal rows are read up to their diagonal");
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  const RowThreads<kWarpRows> threads(rows);
  if (threads.row < 0) return;
  const int valid = kCausal ? static_cast<int>(threads.row % causal) + 1 : n;
  const int64_t offset = threads.row * n;
  const PackedRow<kVec, kLoose> layout(y + offset, n, threads.rank);
  Pack ys[kPacks], gs[kPacks];
  if constexpr (kCausal) {
    load_valid_packs(threads, y + offset, valid, ys);
    load_valid_packs(threads, dy + offset, valid, gs);
  } else {
    load_packs(threads, layout.packs_of(y + offset), layout.packs, ys);
    load_packs(threads, layout.packs_of(dy + offset), layout.packs, gs);
  }
  const A y_spare = layout.loose_of(y + offset), g_spare = layout.loose_of(dy + offset);
  A dot = y_spare * g_spare;  // entries past `valid` are zero packs
#pragma unroll
  for (int p = 0; p < kPacks; ++p)
#pragma unroll
    for (int j = 0; j < kVec; ++j) dot += static_cast<A>(ys[p].elem[j]) * static_cast<A>(gs[p].elem[j]);
  dot = threads.template allreduce<SumOp<A>>(dot);
  if (kLoose && layout.loose.held) dx[offset + layout.loose.index] = static_cast<T>(scale * y_spare * (g_spare - dot));
  Pack* const out = layout.packs_of(dx + offset);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (threads.group(p) >= layout.packs) continue;
    Pack result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A product = scale * static_cast<A>(ys[p].elem[j]) * (static_cast<A>(gs[p].elem[j]) - dot);
      result.elem[j] = static_cast<T>(!kCausal || threads.group(p) * kVec + j < valid ? product : A(0));
    }
    out[threads.group(p)] = result;
  }
}

// ---- Plain rows of up to a 16-byte pack a lane (two-byte up to 256, float
// up to 128), 16-byte aligned: kLanes lanes a row, several rows a warp,
// kShortRowSteps rows a lane loaded before the first reduction. A warp a
// row left lanes idle and a few hundred bytes a warp in flight: row-count
// bound (H200, bf16 (524288, 64): 85 µs, a copy of the bytes 33). The
// exponentials against the row's maximum (scaled, or in natural units where
// |max| reaches 2^24: the warp takes that pass when any of its rows needs
// it, as its shuffles span the warp).
template <typename T, int kLanes>
__global__ void __launch_bounds__(kShortRowWarps* kWarpSize)
    softmax_forward_short_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n,
                                      opmath_t<T> scale) {
  using A = opmath_t<T>;
  constexpr int kVec = Vec16<T>::kSize;
  const ShortRowLane<kLanes> place;
  const int column = place.column();
  const bool in_row = column < n / kVec;
  uint4 packs[kShortRowSteps];
#pragma unroll
  for (int k = 0; k < kShortRowSteps; ++k)
    packs[k] = in_row && place.row(k) < rows ? reinterpret_cast<const uint4*>(x + place.row(k) * n)[column] : uint4{};
  const A scale2 = scale * static_cast<A>(kLog2e), lowest = -std::numeric_limits<A>::infinity();
  const auto row_max = [](A v) { return warp_allreduce<MaxOp<A>, kLanes>(v); };
#pragma unroll
  for (int k = 0; k < kShortRowSteps; ++k) {
    const auto value = [&](int j) { return word_element<T>(packs[k], j); };
    A top = lowest;
#pragma unroll
    for (int j = 0; j < kVec; ++j) top = max_acc(top, in_row ? scale2 * value(j) : lowest);
    top = row_max(top);
    const bool natural = !fma_shift_in_range(top);
    A top_natural = 0;
    if (__any_sync(kFullMask, natural)) {
      top_natural = lowest;
#pragma unroll
      for (int j = 0; j < kVec; ++j) top_natural = max_acc(top_natural, in_row ? mul_rn(scale, value(j)) : lowest);
      top_natural = row_max(top_natural);
    }
    A e[kVec], sum = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      e[j] = natural ? exp_shifted(mul_rn(scale, value(j)), top_natural) : exp2_acc(scale2 * value(j) - top);
      sum += in_row ? e[j] : A(0);
    }
    const A inv = A(1) / warp_allreduce<SumOp<A>, kLanes>(sum);
    if (!in_row || place.row(k) >= rows) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) e[j] *= inv;
    reinterpret_cast<uint4*>(y + place.row(k) * n)[column] = words_of<T>(e);
  }
}

// Their backward: dx = scale * y * (dy - sum(y * dy)), the same layout.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kShortRowWarps* kWarpSize)
    softmax_backward_short_rows_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                       int64_t rows, int n, opmath_t<T> scale) {
  using A = opmath_t<T>;
  constexpr int kVec = Vec16<T>::kSize;
  const ShortRowLane<kLanes> place;
  const int column = place.column();
  const bool in_row = column < n / kVec;
  uint4 ys[kShortRowSteps], gs[kShortRowSteps];  // zero packs past the row add nothing to the dot
#pragma unroll
  for (int k = 0; k < kShortRowSteps; ++k) {
    const bool live = in_row && place.row(k) < rows;
    ys[k] = live ? reinterpret_cast<const uint4*>(y + place.row(k) * n)[column] : uint4{};
    gs[k] = live ? reinterpret_cast<const uint4*>(dy + place.row(k) * n)[column] : uint4{};
  }
#pragma unroll
  for (int k = 0; k < kShortRowSteps; ++k) {
    A dot = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) dot += word_element<T>(ys[k], j) * word_element<T>(gs[k], j);
    dot = warp_allreduce<SumOp<A>, kLanes>(dot);
    if (!in_row || place.row(k) >= rows) continue;
    A out[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = scale * word_element<T>(ys[k], j) * (word_element<T>(gs[k], j) - dot);
    reinterpret_cast<uint4*>(dx + place.row(k) * n)[column] = words_of<T>(out);
  }
}

// The backward of plain rows of 16-byte packs split over a cluster, walking,
// as softmax_forward_pipelined_kernel: a block holds its shares of y and dy
// as the words it read and loads its shares of the next row's while the
// row's dot product is in flight between the blocks. Four packs of each a
// thread (eight spilled). H200, bf16 (bench/micro/pipelined_softmax_backward),
// against the lanes kernel above in a cluster per row: (2048, 65536) 234.6
// -> 187.0 µs, (512, 262144) 264.8 -> 201.2; a copy of the same traffic 188.
// kLoose as the forward's.
template <typename T, int kPacks, bool kLoose>
__global__ void __launch_bounds__(kRowThreadsMax)
    softmax_backward_pipelined_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                      int64_t rows, int n, opmath_t<T> scale) {
  static_assert(std::is_same_v<opmath_t<T>, float>, "two- or four-byte elements");
  constexpr int kVec = Vec16<T>::kSize;
  using A = float;
  using Words = uint4;  // a pack held as words (word_element)
  RowThreads<false> threads(rows);
  walk_pipelined<kPacks, kLoose>(threads, rows, n, n, {y, dy}, [&](int64_t row, const auto& shares, auto&& fetch_next) {
    const Words(&ys)[kPacks] = shares.words[0];
    const Words(&gs)[kPacks] = shares.words[1];
    const PackedRow<kVec, kLoose> layout(y + row * n, n, threads.rank);
    const int groups = layout.packs;
    // 0 where none is held.
    const A y_spare = low_element<T>(shares.spare[0]), g_spare = low_element<T>(shares.spare[1]);
    A dot = y_spare * g_spare;  // packs past the row are zeros
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += word_element<T>(ys[p], j) * word_element<T>(gs[p], j);
    dot = threads.template allreduce<SumOp<A>>(dot, fetch_next);
    if (kLoose && layout.loose.held)
      dx[row * n + layout.loose.index] = static_cast<T>(scale * y_spare * (g_spare - dot));
    Words* const out = reinterpret_cast<Words*>(layout.packs_of(dx + row * n));
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (threads.group(p) >= groups) continue;
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) result[j] = scale * word_element<T>(ys[p], j) * (word_element<T>(gs[p], j) - dot);
      out[threads.group(p)] = words_of<T>(result);
    }
  });
}

// Causal rows of up to 1024, staged in the warp's slice of shared memory:
// a row in registers leaves the lanes past its diagonal idle, staging keeps
// more rows in flight per SM (bf16 (64, 1024, 1024): 73 against 101 µs).
// NaN needs no special care: it makes the sum, and so the whole row, NaN, as in torch.
template <typename T, int kVec>
__global__ void __launch_bounds__(kWarpRowsPerBlock* kWarpSize, kStagedMinBlocks<T>)
    softmax_causal_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n, int64_t causal,
                               opmath_t<T> scale) {
  using A = opmath_t<T>;
  const int64_t row = warp_row(rows);
  if (row < 0) return;
  const int valid = static_cast<int>(row % causal) + 1;
  T* const stage = row_cache<T>(threadIdx.x / kWarpSize, n);  // the warp's slot
  stage_warp_row<kVec>(stage, x + row * n, valid);
  const A scale2 = scale * static_cast<A>(kLog2e);
  A top = -std::numeric_limits<A>::infinity();
  for_each_staged<kVec, A>(stage, valid, [&](A v) { top = max_acc(top, scale2 * v); });
  top = warp_allreduce<MaxOp<A>>(top);
  auto normalise = [&](auto exp_of) {
    A sum = 0;
    for_each_staged<kVec, A>(stage, valid, [&](A v) { sum += exp_of(v); });
    const A inv = A(1) / warp_allreduce<SumOp<A>>(sum);
    map_staged<kVec, A>(stage, y + row * n, n, [&](int first, A(&v)[kVec]) {
      if (first + kVec <= valid) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = exp_of(v[j]) * inv;
      } else if (first >= valid) {  // above the diagonal
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = A(0);
      } else {  // the diagonal's group
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = first + j < valid ? exp_of(v[j]) * inv : A(0);
      }
    });
  };
  if (fma_shift_in_range(top)) {
    normalise([&](A v) { return exp2_acc(scale2 * v - top); });
  } else {
    A top_natural = -std::numeric_limits<A>::infinity();
    for_each_staged<kVec, A>(stage, valid, [&](A v) { top_natural = max_acc(top_natural, mul_rn(scale, v)); });
    top_natural = warp_allreduce<MaxOp<A>>(top_natural);
    normalise([&](A v) { return exp_shifted(mul_rn(scale, v), top_natural); });
  }
}

}  // namespace fastreduce
