// layer_norm and rms_norm, forward and backward, optionally fused with the
// pre-norm residual add, in the three row shapes of row_io.cuh. One set of
// kernels serves both norms, told apart by their Math policy (norm_buffers.h):
// kCentered subtracts the row mean (layer_norm); without it the mean is taken
// as 0 and there is no bias (rms_norm), which is the same arithmetic minus
// the mean terms:
//   forward   xhat = (x - mean) * rstd, rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//   backward  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight
#pragma once

#include "norm_buffers.h"
#include "row_io.cuh"
#include "row_math.cuh"

namespace fastreduce {

// A forward's kernel arguments: its buffers (norm_buffers.h), typed. P, the
// parameters' type, is float beside two-byte rows only in the kernels that
// take it (norms.cu routes mixed precision to them).
template <typename T, typename P = T>
struct NormForwardArgs : NormForwardBuffers<T, opmath_t<T>, P> {
  int64_t rows, n;
  opmath_t<T> eps;
};

// A backward's: its buffers, and where the weight and bias gradient partials
// go (null when not wanted; partial_b also null without a bias).
template <typename T, typename P = T>
struct NormBackwardArgs : NormBackwardBuffers<T, opmath_t<T>, P> {
  opmath_t<T>* partial_w;
  opmath_t<T>* partial_b;
  int64_t rows, n;
  int64_t rows_per_group;  // lanes kernels: rows per warp or block
  // Block-row lanes kernels with 16-byte packs: the next row's x and dy are
  // copied into shared memory after the two partial-sum slots.
  bool prefetch;
};

// A row's rstd (and mean, 0 for rms_norm) from the values this thread holds
// (for_each), `shift` common to the row (row_variance), summed over the row's
// threads by row_sum.
template <bool kCentered, typename A, typename ForEach, typename RowSum, typename Again>
__device__ __forceinline__ A row_rstd(int64_t n, A eps, A shift, ForEach&& for_each, RowSum&& row_sum, A& mean,
                                      Again&& again) {
  if constexpr (kCentered) {
    return rsqrt_acc(
        row_variance(shift, A(LayerNormMath::kShiftedSpreadMax), n, for_each, row_sum, mean, again) + eps);
  } else {
    A squares = 0;
    for_each([&](A v) { squares += v * v; });
    mean = 0;
    return rsqrt_acc(row_sum(squares) / static_cast<A>(n) + eps);
  }
}
template <bool kCentered, typename A, typename ForEach, typename RowSum>
__device__ __forceinline__ A row_rstd(int64_t n, A eps, A shift, ForEach&& for_each, RowSum&& row_sum, A& mean) {
  return row_rstd<kCentered>(n, eps, shift, for_each, row_sum, mean, for_each);
}

template <bool kCentered, typename A>
__device__ __forceinline__ A row_mean(const A* mean, int64_t row) {
  if constexpr (kCentered) return mean[row];
  else return A(0);
}

// ---- One block per row (long or unaligned rows); the launcher adds any
// residual in a separate pass first.

template <typename T, typename Math, typename P = T>
__global__ void norm_forward_block_kernel(NormForwardArgs<T, P> a, bool cached) {
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  __shared__ Deviations<A> scratch[kWarpSize];  // room for a sum or a pair of sums
  const int64_t n = a.n, offset = blockIdx.x * n;
  const Row<T, A> row = stage_row(a.x + offset, n, cached ? stage_slot<A>(0, n) : nullptr);
  A mean;
  const A rstd = row_rstd<kCentered>(
      n, a.eps, row[0],
      [&](auto f) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(row[i]);
      },
      [&](auto v) { return block_allreduce<SumOp<decltype(v)>>(v, reinterpret_cast<decltype(v)*>(scratch)); }, mean);
  // The parameters' loads of four elements in flight (as the backward's).
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = (row[i] - mean) * rstd;
    if (a.weight) v *= static_cast<A>(a.weight[i]);
    if (a.bias) v += static_cast<A>(a.bias[i]);
    a.y[offset + i] = static_cast<T>(v);
  }
  if (threadIdx.x == 0) {
    if constexpr (kCentered) a.mean[blockIdx.x] = mean;
    a.rstd[blockIdx.x] = rstd;
  }
}

// h = x + residual, element-wise, for the block kernel above.
template <typename T>
__global__ void add_residual_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ h,
                                    int64_t count) {
  using A = opmath_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    h[i] = static_cast<T>(static_cast<A>(x[i]) + static_cast<A>(residual[i]));
}

template <typename T, typename Math, typename P = T>
__global__ void norm_backward_block_kernel(NormBackwardArgs<T, P> a, bool cached) {
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  __shared__ A scratch[kWarpSize];
  const int64_t n = a.n, offset = blockIdx.x * n;
  const Row<T, A> xs = stage_row(a.x + offset, n, cached ? stage_slot<A>(0, n) : nullptr);
  const Row<T, A> gs = stage_row(a.dy + offset, n, cached ? stage_slot<A>(1, n) : nullptr);
  const A mu = row_mean<kCentered>(a.mean, blockIdx.x), r = a.rstd[blockIdx.x];
  auto g_at = [&](int64_t i) { return a.weight ? gs[i] * static_cast<A>(a.weight[i]) : gs[i]; };
  A sum_g = 0, sum_gx = 0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum_g += g_at(i);
    sum_gx += g_at(i) * (xs[i] - mu) * r;
  }
  const A mean_g = kCentered ? block_allreduce<SumOp<A>>(sum_g, scratch) / static_cast<A>(n) : A(0);
  const A mean_gx = block_allreduce<SumOp<A>>(sum_gx, scratch) / static_cast<A>(n);
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = r * (g_at(i) - mean_g - (xs[i] - mu) * r * mean_gx);
    if (a.grad_residual) v += static_cast<A>(a.grad_residual[offset + i]);
    a.dx[offset + i] = static_cast<T>(v);
  }
}

// Stage one of the weight and bias gradients where the dx kernel cannot fuse
// it: block (column tile, row chunk) writes partial[chunk, c] = sum over its
// rows of dy * xhat (and of dy). Stage two is a column reduction of the
// partials (fixed order: deterministic).
constexpr int kGradTile = 32, kGradLanes = 8;
template <typename T, typename Math, typename P = T>
__global__ void __launch_bounds__(kGradTile* kGradLanes)
    norm_backward_params_kernel(NormBackwardArgs<T, P> a, int64_t rows_per_chunk) {
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  __shared__ A tile_w[kGradLanes][kGradTile + 1], tile_b[kGradLanes][kGradTile + 1];
  const int tx = threadIdx.x % kGradTile, ty = threadIdx.x / kGradTile;
  const int64_t n = a.n, c = blockIdx.x * int64_t(kGradTile) + tx;
  const int64_t first = blockIdx.y * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < a.rows ? first + rows_per_chunk : a.rows;
  A w = 0, b = 0;
  if (c < n) {
    // Four rows' loads in flight a thread, not one: with the block kernels'
    // loops unrolled alike, H200 bf16 (8192, 4095) forward + backward a
    // call, rms_norm 284.5 -> 256.1 µs, layer_norm 325.0 -> 312.5.
#pragma unroll 4
    for (int64_t r = first + ty; r < last; r += kGradLanes) {
      const A g = static_cast<A>(a.dy[r * n + c]);
      w += g * (static_cast<A>(a.x[r * n + c]) - row_mean<kCentered>(a.mean, r)) * a.rstd[r];
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
    a.partial_w[blockIdx.y * n + c] = w;
    if (a.partial_b) a.partial_b[blockIdx.y * n + c] = b;
  }
}

// Whether rms_norm-like (uncentred) forwards of T stage their weight in the
// one-row block kernel (see the kernel; the launcher gives the room).
template <typename T, typename Math>
constexpr bool kStagesWeight = !Math::kCentered && sizeof(T) == 2;

// A walking kernel's parameters: each thread copies the weight and bias
// packs it uses into its own slots of dynamic shared memory once
// (kPacks * blockDim.x slots of each parameter given, the weight's first),
// and every row reads them there. kAlways: slots for both parameters
// whether given or not, filled with ones and zeros where not, so the output
// pass is one straight line for every combination.
template <typename T, int kVec>
struct WalkSlots {
  VecN<T, kVec>* weight;
  VecN<T, kVec>* bias;
};
// The shared-memory bytes of one pack's slots of both parameters (kAlways, or
// both given): layer_norm's weight and bias, rms_norm's weight.
template <typename T, int kVec, typename Math>
constexpr size_t kWalkSlotBytes = (Math::kCentered ? 2 : 1) * sizeof(VecN<T, kVec>);
template <int kPacks, int kVec, typename Math, bool kAlways = false, typename T, bool kWarpRows>
__device__ __forceinline__ WalkSlots<T, kVec> copy_to_walk_slots(const NormForwardArgs<T>& a,
                                                                  const RowThreads<kWarpRows>& threads, int groups) {
  using Pack = VecN<T, kVec>;
  Pack* const weight = reinterpret_cast<Pack*>(row_cache<T>(0, 0));
  Pack* const bias = weight + (kAlways || a.weight ? kPacks * blockDim.x : 0);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    if (threads.group(p) >= groups) continue;
    if (kAlways || a.weight) {
      Pack ones;
#pragma unroll
      for (int j = 0; j < kVec; ++j) ones.elem[j] = static_cast<T>(1.0f);
      weight[threads.local(p)] = a.weight ? reinterpret_cast<const Pack*>(a.weight)[threads.group(p)] : ones;
    }
    if (Math::kCentered && (kAlways || a.bias))
      bias[threads.local(p)] = a.bias ? reinterpret_cast<const Pack*>(a.bias)[threads.group(p)] : Pack{};
  }
  return {weight, bias};
}

// Walking kernels of eight packs of four- or eight-byte elements load their
// next row during each row's exchange (norm_forward_lanes_kernel), taking two
// rows' registers, one block an SM. H200, float32 (bench/micro/norm_forward):
// layer_norm (512, 262144) 339.7 -> 304.5 µs, (1024, 131072) 315.0 -> 292.1,
// (2048, 65536) 298.5 -> 288.7; rms_norm (1024, 131072) 294.5 -> 274.0,
// (2048, 65536) 283.2 -> 274.3. Two-byte walks of eight packs ran 30-40%
// slower so (bf16 (512, 262144) rms_norm 153 -> 206 µs) and keep four packs,
// two blocks an SM, where the other block's loads cover an exchange. Rows
// without a residual run norm_forward_pipelined_kernel (below) instead, up to
// 16 of its 256-thread blocks (131072 floats, 262144 bf16).
template <typename T, int kPacks>
constexpr bool kPrefetchingWalk = kPacks == 8 && sizeof(T) >= 4;

// x + residual rounded to T, a 16-byte pack (float accumulators, rounded as
// words: words_of).
template <typename T>
__device__ __forceinline__ Vec16<T> rounded_sum(const Vec16<T>& x, const Vec16<T>& residual) {
  constexpr int kVec = Vec16<T>::kSize;
  opmath_t<T> sums[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) sums[j] = element(x, j) + element(residual, j);
  const uint4 words = words_of<T>(sums);
  Vec16<T> pack;
  memcpy(&pack, &words, sizeof(pack));
  return pack;
}

// ---- One block per row, read twice (rows without a residual: two-byte
// rms_norm's 4097-16384, layer_norm's bf16 8193-16384, float 8192-16384 of
// both, eight packs a thread past 8192 floats; loose rows and rows with the
// add too: the launcher, norms.cu): the first read takes
// the sums without holding the row, the second normalizes it from L2, streaming
// it and the output past L2. A thread holds one read's packs, not the row
// through the reduction: rms_norm at 16384 takes 32 registers and four blocks
// of 512 an SM, the row in registers 58 and two. kKeepInL2: the first read asks
// L2 to keep the row (l2_keep_policy): rows of 32 KiB and more need it (bf16
// 16384, float 8192: 129.6 -> 126.6 µs); two-byte rows of 8192 and less find
// theirs without it (asking costs rms_norm's 2-4%). H200, bf16, µs,
// (8192, 16384), the hints added one at a time (a copy of this kernel with each
// switchable; NOTES, thirty-fifth session): rms_norm 136.2-136.4 with none,
// 131.5-131.7 with the keep, 129.1-129.4 with the streaming second read too,
// 127.6-127.7 with the streaming store too; layer_norm 141.9-142.1,
// 134.3-134.7, 130.0-130.2, 128.2-128.6. kLoose: rows that are not whole
// packs (PackedRow), the loose element held through the sums, the
// parameters read shifted to the row's packs (with_loose_params). kAdd: the
// row is h = x + residual, written by the first read (kKeepInL2: asking L2
// to keep it) and read back by the second.
template <typename T, int kPacks, typename Math, bool kKeepInL2, bool kLoose = false, bool kAdd = false>
__global__ void __launch_bounds__(kRowThreadsMax) norm_forward_reread_kernel(NormForwardArgs<T> a) {
  static_assert(!(kLoose && kAdd), "the launcher adds a loose row's residual in a pass first");
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  using Pack = Vec16<T>;
  constexpr int kVec = Pack::kSize;
  const RowThreads<false> threads(a.rows);
  const int64_t offset = threads.row * a.n;
  const PackedRow<kVec, kLoose> layout(a.x + offset, static_cast<int>(a.n), threads.rank);
  const Pack* const x = layout.packs_of(a.x + offset);
  Pack* const h = kAdd ? reinterpret_cast<Pack*>(a.residual_out + offset) : nullptr;
  const Pack* const row = kAdd ? h : x;  // the row the second read normalizes
  const int groups = layout.packs;
  const uint64_t keep = kKeepInL2 ? l2_keep_policy() : 0;
  const A spare = layout.loose_of(a.x + offset);  // held through the sums, not read again
  // Summed last pack first, so that ptxas issues every load before the first
  // sum (summed in order, float rms_norm's kernels summed pack 0 before
  // issuing pack 1's load). H200, µs (a kernel A/B, NOTES): float32 rms_norm
  // (8192, 16384) 277 -> 252, (8192, 12000) 223 -> 185.
  const auto sum_packs = [&](auto f, const Pack(&packs)[kPacks]) {
#pragma unroll
    for (int p = kPacks - 1; p >= 0; --p)
      if (threads.group(p) < groups)
#pragma unroll
        for (int j = 0; j < kVec; ++j) f(element(packs[p], j));
    if (kLoose && layout.loose.held) f(spare);
  };
  const A first = kCentered ? static_cast<A>(a.x[offset]) + (kAdd ? static_cast<A>(a.residual[offset]) : A(0)) : A(0);
  A mean;
  const A rstd = row_rstd<kCentered>(
      a.n, a.eps, first,
      [&](auto f) {
        Pack packs[kPacks];
        if constexpr (kAdd) {
          // h = x + residual, stored asking L2 to keep it for the second
          // read; every load issued before the first store, which the
          // compiler could not move them past.
          const Pack* const residual = reinterpret_cast<const Pack*>(a.residual + offset);
          Pack adds[kPacks];
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (threads.group(p) < groups) packs[p] = x[threads.group(p)], adds[p] = residual[threads.group(p)];
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (threads.group(p) < groups) {
              packs[p] = rounded_sum(packs[p], adds[p]);
              if (kKeepInL2) store_keeping_in_l2(h + threads.group(p), packs[p], keep);
              else h[threads.group(p)] = packs[p];
            }
        } else {
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (threads.group(p) < groups)
              packs[p] = kKeepInL2 ? load_keeping_in_l2(x + threads.group(p), keep) : x[threads.group(p)];
        }
        sum_packs(f, packs);
      },
      [&](auto v) { return threads.template allreduce<SumOp<decltype(v)>>(v); }, mean,
      [&](auto f) {  // row_variance's rare second pass: the row again (h, with kAdd)
        // x with the first read's keep hint: loaded plainly, float and bf16
        // layer_norm's loose eight-pack kernels took 82 and 80 registers for
        // 64 (three blocks of 256 an SM for four; float32 (4096, 8191) 72 ->
        // 82 µs, H200, NOTES).
        Pack packs[kPacks];
#pragma unroll
        for (int p = 0; p < kPacks; ++p)
          if (threads.group(p) < groups)
            packs[p] = !kAdd && kKeepInL2 ? load_keeping_in_l2(row + threads.group(p), keep) : row[threads.group(p)];
        sum_packs(f, packs);
      });
  const RowNormalizer<T, A> normalize(mean, rstd);
  const bool weighted = a.weight != nullptr, biased = kCentered && a.bias;
  uint4* const out = reinterpret_cast<uint4*>(layout.packs_of(a.y + offset));
  const auto write = [&](auto weight_at, auto bias_at) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = threads.group(p);
      if (g >= groups) continue;
      const Pack v = load_streaming(row + g);
      const Pack w = a.weight ? weight_at(g) : Pack{};
      const Pack b = kCentered && a.bias ? bias_at(g) : Pack{};
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        result[j] = normalize(element(v, j)) * (a.weight ? element(w, j) : A(1)) +
                    (kCentered && a.bias ? element(b, j) : A(0));
      store_streaming(out + g, words_of<T>(result));
    }
  };
  if constexpr (kLoose) {
    with_loose_params<T, kVec>(a.weight, a.bias, layout.head, weighted, biased, write);
    if (layout.loose.held) {
      const int64_t i = layout.loose.index;
      a.y[offset + i] = static_cast<T>(normalize(spare) * (weighted ? static_cast<A>(a.weight[i]) : A(1)) +
                                       (biased ? static_cast<A>(a.bias[i]) : A(0)));
    }
  } else {
    write([&](int g) { return reinterpret_cast<const Pack*>(a.weight)[g]; },
          [&](int g) { return reinterpret_cast<const Pack*>(a.bias)[g]; });
  }
  if (threads.rank == 0) {
    if constexpr (kCentered) a.mean[threads.row] = mean;
    a.rstd[threads.row] = rstd;
  }
}

// ---- The row in registers. Warp rows load the weight and bias packs with
// the x packs, so the output pass only computes and stores (faster than
// reading them after the statistics or staging them in shared memory).
// Block rows (wide) read them in the output pass instead, from L1 or L2
// (every row shares them): the registers saved let twice the rows be in
// flight per SM, which takes wide rows to the copy rate.
//
// kWalk (block rows in clusters of kWalkClusterMin): fewer row groups than
// rows are launched, and group k (a cluster) takes rows k, k + G, ... of the
// G in the grid. Each thread first copies the weight and bias packs it will
// use into its own slots of dynamic shared memory (kPacks * blockDim.x packs
// a parameter), and every row reads them from there: read per row through
// L1, layer_norm's two parameters (64 KiB each a block at float rows of
// 262144) missed it. The slots hold the parameters' own packs: layer_norm's
// two-byte weight held as floats (one unpacking an element less) made 48
// bytes of shared-memory reads a pack, which every warp issued at once after
// the exchange and then waited on (ncu: short-scoreboard stalls at the
// bias's unpacking). H200, µs, floats -> packs: pipelined layer_norm bf16
// (512, 262144) 153-155 -> 138-139, (2048, 65536) 144-145 -> 136-137,
// float16 (512, 262144) 154-155 -> 138-139; this walk with the add, bf16
// (2048, 65536) 296-299 -> 300-303, (512, 262144) ties, float16 (512,
// 262144) 299-304 -> 289-293 (read as words here, bf16 lost 14%).
//
// layer_norm's walking kernels of at most four packs a thread are held to two
// blocks an SM, as their one-row kernels run (bf16 took 73 registers unheld,
// so the launcher would not walk). rms_norm's fit unheld; held, bf16 spilled
// and ran 25% slower. layer_norm's one-row kernel of four float packs is held
// to three (its second pass took it from 40 registers to 54 and two blocks).
// Walks of eight packs (kPrefetchingWalk among them: two rows, one block an
// SM by design) are unheld. Every other kernel states no minimum (0: a
// stated 1 changes ptxas's register choices).
template <typename T, int kPacks, int kVec, typename Math, bool kWalk>
constexpr int forward_min_blocks() {
  if (!Math::kCentered || kPacks * sizeof(VecN<T, kVec>) > 64) return 0;
  if (kWalk) return 2;
  return sizeof(T) == 4 && kPacks == 4 ? 3 : 0;
}

// When the one-row kernels load their parameter packs. kPerPack: in the
// output pass, each pack before its store; ptxas issues each load after the
// store before it (read-only __ldg loads too), so four packs wait four L1 or
// L2 round trips in a row. kBeforeOutput (block rows):
// every pack after the reduction, before the first store; it costs
// layer_norm 11 registers (two-byte, four packs: 70), so the launcher takes it
// only where the blocks an SM stay. kWithRow (warp rows): with the row, before
// the reduction, their latency behind the row's; it holds them in registers
// through the reduction, which two-byte rows of four packs pay for in blocks an
// SM (bench/micro/short_rows.cu). kAhead: per pack, pack p + 1's loaded before
// pack p's arithmetic and store, so that each waits behind that arithmetic
// instead of a store (one pack's parameters more in registers;
// bench/micro/param_loads.cu).
enum class ParamLoads { kPerPack, kAhead, kBeforeOutput, kWithRow };

// How the one-row kernels take the fused add (a.residual may be given).
// kNone: its code compiled out (two-byte warp rows of seven packs take 58
// registers instead of 82: the add's packs and the row's are live together
// there). kInRegisters: the residual's packs loaded beside the row's.
// kStaged (warp rows of 16-byte packs): the residual copied into the warp's
// slot of dynamic shared memory (staged_add_bytes) while the row loads, then
// added pack by pack, so that only the row's packs wait in registers.
enum class ResidualAdd { kNone, kInRegisters, kStaged };

template <int kPacks>
constexpr size_t staged_add_bytes(int warps) {
  return size_t(warps) * kPacks * kWarpSize * 16;
}

// kAffine: compiled for a given weight (and layer_norm's bias), so that the
// output pass has no null checks or selects. kFullRow (warp rows): compiled
// for rows of exactly kPacks packs a lane, so that no pack is guarded. P:
// the parameters' type; float beside two-byte rows loads them per pack.
// kThreads: the most threads a block (kWideRowThreads for the widest
// one-block rows).
template <typename T, int kPacks, int kVec, bool kWarpRows, typename Math, bool kWalk = false,
          ParamLoads kParams = ParamLoads::kPerPack, ResidualAdd kResidual = ResidualAdd::kInRegisters,
          bool kAffine = false, bool kFullRow = false, typename P = T, int kThreads = kRowThreadsBound<kWarpRows>>
__global__ void __launch_bounds__(kThreads, (forward_min_blocks<T, kPacks, kVec, Math, kWalk>()))
    norm_forward_lanes_kernel(NormForwardArgs<T, P> a) {
  static_assert(!kWalk || !kWarpRows, "block rows walk");
  static_assert(kResidual != ResidualAdd::kStaged || (kWarpRows && sizeof(VecN<T, kVec>) == 16),
                "warp rows of 16-byte packs stage the residual");
  static_assert(kParams == ParamLoads::kPerPack || !kWalk, "walks read their parameters from shared memory");
  static_assert(kParams != ParamLoads::kBeforeOutput || !kWarpRows, "only block rows load them before the output");
  static_assert(kParams != ParamLoads::kWithRow || kWarpRows, "only warp rows load them with the row");
  static_assert(!kFullRow || kWarpRows, "full rows are warp rows");
  constexpr bool kOwnParams = std::is_same_v<P, T>;
  static_assert(kOwnParams || (kParams == ParamLoads::kPerPack && !kWalk), "float parameters load per pack");
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  using ParamPack = VecN<P, kVec>;
  // One-row kernels read two-byte packs as 32-bit words (a shift or a mask an
  // element, not an extract and a shift); walking kernels keep the packs'
  // fields (as words, layer_norm bf16's walk ran 7% slower: NOTES.md).
  constexpr bool kWords = !kWalk && sizeof(T) == 2;
  // Walks of eight float packs a thread (kPrefetchingWalk) run one block an
  // SM, so no other block's loads cover their exchanges: they load their
  // share of the next row while the current row's sums are in flight (rows
  // without a residual).
  constexpr bool kPrefetch = kWalk && kPrefetchingWalk<T, kPacks>;
  const auto value = [](const auto& pack, int j) -> A {
    if constexpr (kWords && std::is_same_v<std::decay_t<decltype(pack)>, Pack>) return element(pack, j);
    else return static_cast<A>(pack.elem[j]);
  };
  // h = x + residual rounded to T in place of x's pack: 16-byte packs of
  // float accumulators round as words, two-byte ones two fields at a time
  // (set field by field, a pack is split into 16-bit registers from its
  // load on: add_layer_norm bf16 (8192, 768) executed 1.7x torch.compile's
  // instructions, NOTES.md).
  const auto add_into = [&](Pack& pack, const Pack& add) {
    if constexpr (sizeof(Pack) == 16 && std::is_same_v<A, float>) {
      A sums[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) sums[j] = value(pack, j) + value(add, j);
      const uint4 words = words_of<T>(sums);
      memcpy(&pack, &words, sizeof(Pack));
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) pack.elem[j] = static_cast<T>(value(pack, j) + value(add, j));
    }
  };
  RowThreads<kWarpRows> threads(a.rows);
  if (threads.row < 0) return;
  const int n = static_cast<int>(a.n), groups = n / kVec;
  const auto in_row = [&](int p) { return kFullRow || threads.group(p) < groups; };
  // Evaluated at each use: bools computed once here compile the kAffine =
  // false kernels differently (their SASS changes; as lambdas it does not).
  const auto weighted = [&] { return kAffine || a.weight; };
  const auto biased = [&] { return kCentered && (kAffine || a.bias); };
  WalkSlots<T, kVec> slots{};
  if constexpr (kWalk) slots = copy_to_walk_slots<kPacks, kVec, Math>(a, threads, groups);
  // rms_norm's two-byte one-row blocks copy their weight packs into shared
  // memory as the row loads, where the launcher gives them room (single
  // blocks, not clusters): read after the reduction, they no longer wait on
  // L2 there (H100, bf16 (8192, 1600) 18.3 -> 17.7 µs). layer_norm's weight
  // and bias staged so ran 10% slower.
  constexpr bool kStagedWeight = kStagesWeight<T, Math> && !kWarpRows && !kWalk && sizeof(Pack) == 16 && kOwnParams;
  Pack* staged_weight = nullptr;
  if constexpr (kStagedWeight) {
    if (a.weight && dynamic_shared_bytes() >= kPacks * blockDim.x * sizeof(Pack)) {
      staged_weight = reinterpret_cast<Pack*>(row_cache<T>(0, 0));
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (in_row(p))
          copy16_async</*kThroughL1=*/true>(&staged_weight[threads.local(p)],
                                             reinterpret_cast<const Pack*>(a.weight) + threads.group(p));
    }
  }
  const int64_t row_groups = gridDim.x / cluster_blocks();
  const auto load_x = [&](int64_t row, Pack(&packs)[kPacks]) {
    load_packs<kWords, kFullRow>(threads, reinterpret_cast<const Pack*>(a.x + row * a.n), groups, packs);
  };
  const bool prefetch = kPrefetch && !a.residual;
  Pack ahead[kPacks];
  // With the next row, its first value (layer_norm's shift): read at the
  // row's start, the row's sums would wait on it.
  T ahead_head{};
  const auto prefetch_row = [&](int64_t row) {
    load_x(row, ahead);
    if constexpr (kCentered) ahead_head = a.x[row * a.n];
  };
  if (prefetch && threads.row < a.rows) prefetch_row(threads.row);
  for (;; threads.row += row_groups) {
    if constexpr (kWalk) {
      if (threads.row >= a.rows) break;
      // Addresses recomputed each row: hoisted out of the loop they would
      // hold a register pair per pack and buffer.
      asm volatile("" : "+r"(threads.rank), "+r"(threads.count));
    }
    const int64_t offset = threads.row * a.n;
    Pack packs[kPacks];
    ParamPack scales[kPacks], shifts[kPacks];
    T head{};
    if (prefetch) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) packs[p] = ahead[p];
      head = ahead_head;
    } else {
      load_x(threads.row, packs);
    }
    bool fetched = false;
    const auto fetch_next = [&] {
      if (!prefetch || fetched) return;
      fetched = true;
      const int64_t next = threads.row + row_groups;
      if (next < a.rows) prefetch_row(next);
    };
    if (kResidual == ResidualAdd::kInRegisters && a.residual) {
      Pack adds[kPacks];
      load_packs<kWords, kFullRow>(threads, reinterpret_cast<const Pack*>(a.residual + offset), groups, adds);
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        add_into(packs[p], adds[p]);
        if (in_row(p)) reinterpret_cast<Pack*>(a.residual_out + offset)[threads.group(p)] = packs[p];
      }
    }
    if (kResidual == ResidualAdd::kStaged && a.residual) {
      // Each lane reads back only the packs it copied: no warp barrier.
      Pack* const slot = reinterpret_cast<Pack*>(row_cache<T>(threadIdx.x / kWarpSize, kPacks * kWarpSize * kVec));
      const Pack* const residual = reinterpret_cast<const Pack*>(a.residual + offset);
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (in_row(p)) copy16_async(&slot[threads.group(p)], &residual[threads.group(p)]);
      wait_async_copies();
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (!in_row(p)) continue;
        add_into(packs[p], slot[threads.group(p)]);
        reinterpret_cast<Pack*>(a.residual_out + offset)[threads.group(p)] = packs[p];
      }
    }
    constexpr bool kWithRow = kParams == ParamLoads::kWithRow;
    if constexpr (kWithRow) {
      if (weighted()) load_packs<kWords, kFullRow>(threads, reinterpret_cast<const Pack*>(a.weight), groups, scales);
      // rms_norm has no bias: without kCentered the shift packs are never
      // loaded, which frees their registers.
      if (biased()) load_packs<kWords, kFullRow>(threads, reinterpret_cast<const Pack*>(a.bias), groups, shifts);
    }
    // The row's first value as the shift: lane 0's in a warp row, a load
    // every thread shares in a block row (a prefetching walk's came with the
    // row).
    A shift = 0;
    if constexpr (kCentered && kWarpRows) shift = __shfl_sync(kFullMask, value(packs[0], 0), 0);
    if constexpr (kCentered && !kWarpRows)
      shift = prefetch ? static_cast<A>(head)
                       : static_cast<A>(a.x[offset]) + (a.residual ? static_cast<A>(a.residual[offset]) : A(0));
    A mean;
    const A rstd = row_rstd<kCentered>(
        n, a.eps, shift,
        [&](auto f) {
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (in_row(p))
#pragma unroll
              for (int j = 0; j < kVec; ++j) f(value(packs[p], j));
        },
        [&](auto v) { return threads.template allreduce<SumOp<decltype(v)>>(v, fetch_next); }, mean);
    Pack* const out = reinterpret_cast<Pack*>(a.y + offset);
    const RowNormalizer<T, A> normalize(mean, rstd);
    if (staged_weight) wait_async_copies();
    const auto load_params = [&](int p) {
      if constexpr (kOwnParams) {
        if (staged_weight) scales[p] = staged_weight[threads.local(p)];
        else if (weighted()) scales[p] = reinterpret_cast<const Pack*>(a.weight)[threads.group(p)];
        if (biased()) shifts[p] = reinterpret_cast<const Pack*>(a.bias)[threads.group(p)];
      } else {
        if (weighted()) scales[p] = load_param_pack<kVec>(a.weight + int64_t(threads.group(p)) * kVec);
        if (biased()) shifts[p] = load_param_pack<kVec>(a.bias + int64_t(threads.group(p)) * kVec);
      }
    };
    if constexpr (kParams == ParamLoads::kBeforeOutput) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (in_row(p)) load_params(p);
    }
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (!in_row(p)) continue;
      Pack walk_weight;
      if constexpr (kWalk) {
        // Whole slots either way: assigned only where a parameter is given,
        // they stay live from row to row (layer_norm bf16: 97 registers, not
        // 64). The one-row kernels do not loop, and run 1-3% slower so.
        walk_weight = weighted() ? slots.weight[threads.local(p)] : Pack{};
        shifts[p] = biased() ? slots.bias[threads.local(p)] : Pack{};
      } else if constexpr (kParams == ParamLoads::kPerPack) {
        load_params(p);
      } else if constexpr (kParams == ParamLoads::kAhead) {
        if (p == 0) load_params(0);
        if (p + 1 < kPacks && in_row(p + 1)) load_params(p + 1);
      }
      Pack result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A w = !weighted() ? A(1) : kWalk ? static_cast<A>(walk_weight.elem[j]) : value(scales[p], j);
        const A b = biased() ? value(shifts[p], j) : A(0);
        result.elem[j] = static_cast<T>(normalize(value(packs[p], j)) * w + b);
      }
      out[threads.group(p)] = result;
    }
    if (threads.rank == 0) {
      if constexpr (kCentered) a.mean[threads.row] = mean;
      a.rstd[threads.row] = rstd;
    }
    if constexpr (!kWalk) break;
  }
}

// Rows of 16-byte packs without a residual, split over a cluster and walking,
// as softmax_forward_pipelined_kernel: a block holds its share of a row as
// the words it read and its share of the next row beside them, loaded while
// the row's sums are in flight between the blocks. The parameters come from
// shared memory (copy_to_walk_slots), as the lanes kernel's walk's.
template <typename T, int kPacks, typename Math>
__global__ void __launch_bounds__(kRowThreadsMax) norm_forward_pipelined_kernel(NormForwardArgs<T> a) {
  static_assert(std::is_same_v<opmath_t<T>, float>, "two- or four-byte elements");
  constexpr bool kCentered = Math::kCentered;
  constexpr int kVec = Vec16<T>::kSize;
  using A = float;
  using Pack = Vec16<T>;
  using Words = uint4;  // a pack held as words (word_element)
  RowThreads<false> threads(a.rows);
  const int n = static_cast<int>(a.n), groups = n / kVec;
  const WalkSlots<T, kVec> slots = copy_to_walk_slots<kPacks, kVec, Math, true>(a, threads, groups);
  const Words* const weight_words = reinterpret_cast<const Words*>(slots.weight);
  const Words* const bias_words = reinterpret_cast<const Words*>(slots.bias);
  walk_pipelined<kPacks>(threads, a.rows, a.n, a.n, {a.x}, [&](int64_t row, const auto& shares, auto&& fetch_next) {
    const Words(&packs)[kPacks] = shares.words[0];
    const int64_t offset = row * a.n;
    // The row's first value as the shift (row_variance), loaded with the
    // row: read here from memory, every row's sums waited on it (H200,
    // layer_norm bf16, µs: (512, 262144) 163.2-164.0 -> 153.8-155.2, (1024,
    // 131072) 153.8-154.8 -> 146.7-148.2, (2048, 65536) 149.1-150.4 ->
    // 145.0-145.8; float32 (512, 131072) 148.2-148.8 -> 146.0-147.0).
    const A shift = kCentered ? low_element<T>(shares.head) : A(0);
    A mean;
    const A rstd = row_rstd<kCentered>(
        n, a.eps, shift,
        [&](auto f) {
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (threads.group(p) < groups)
#pragma unroll
              for (int j = 0; j < kVec; ++j) f(word_element<T>(packs[p], j));
        },
        [&](auto v) { return threads.template allreduce<SumOp<decltype(v)>>(v, fetch_next); }, mean,
        [&](auto f) {  // layer_norm's rare second pass, from memory a pack at a time
#pragma unroll 1
          for (int g = threads.rank; g < groups; g += threads.count) {
            const Words words = reinterpret_cast<const Words*>(a.x + offset)[g];
#pragma unroll
            for (int j = 0; j < kVec; ++j) f(word_element<T>(words, j));
          }
        });
    const RowNormalizer<T, A> normalize(mean, rstd);
    Words* const out = reinterpret_cast<Words*>(a.y + offset);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (threads.group(p) >= groups) continue;
      // The parameters' slots read as words, as the row's shares.
      const Words w = weight_words[threads.local(p)];
      const Words b = kCentered ? bias_words[threads.local(p)] : Words{};
      A result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A v = normalize(word_element<T>(packs[p], j)) * word_element<T>(w, j);
        result[j] = kCentered ? v + word_element<T>(b, j) : v;
      }
      out[threads.group(p)] = words_of<T>(result);
    }
    if (threads.rank == 0) {
      if constexpr (kCentered) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  });
}

// layer_norm's two row sums of the backward, g and g * xhat, reduced together
// (one exchange in a cluster).
template <typename A>
struct GradientSums {
  A g, gx;
  GradientSums() = default;
  __device__ explicit GradientSums(int zero) : g(zero), gx(zero) {}
  __device__ GradientSums(A g, A gx) : g(g), gx(gx) {}
  __device__ friend GradientSums operator+(const GradientSums& a, const GradientSums& b) {
    return {a.g + b.g, a.gx + b.gx};
  }
};

// dx with x, dy and weight in registers; row group k (a warp, a block or a
// cluster) takes rows [k * rows_per_group, (k + 1) * rows_per_group). With
// `partial_w` each group also sums dy * xhat (and dy) over its rows into its
// own row_cache() slots of shared memory, each column added to only by the
// thread that holds it, and the group writes one partial row each of
// partial_w/partial_b[its index] (warps: their slots folded in warp order,
// so the sums are bitwise reproducible): x and dy are read once for all
// three gradients, with no atomics. A fold of the partial rows follows.
//
// kStagedResidual (two-byte rows of 16-byte packs with a residual gradient):
// each row's residual gradient is copied into the last bytes of dynamic
// shared memory as the row loads (a row's share for each row group of the
// block). Read at the store from global memory, each of its loads would wait
// behind the store before it (dx may alias it, for all the compiler knows);
// staged, its latency hides behind the reductions.
template <typename T, int kVec>
constexpr bool kStagesResidual = sizeof(T) == 2 && sizeof(VecN<T, kVec>) == 16;

template <typename T, int kPacks, int kVec, bool kWarpRows, typename Math, bool kStagedResidual = false,
          typename P = T>
__global__ void __launch_bounds__(kRowThreadsBound<kWarpRows>) norm_backward_lanes_kernel(NormBackwardArgs<T, P> a) {
  static_assert(!kStagedResidual || kStagesResidual<T, kVec>, "two-byte rows of 16-byte packs");
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  using Pack = VecN<T, kVec>;
  using Sums = VecN<A, kVec>;
  RowThreads<kWarpRows> threads(a.rows);
  const int n = static_cast<int>(a.n), groups = n / kVec;
  const int slot = kWarpRows ? threadIdx.x / kWarpSize : 0;
  const int slots = kWarpRows ? blockDim.x / kWarpSize : 1;
  // Elements of the row this block holds: its shared-memory slots hold as
  // many (a cluster's block, its share).
  const int share = kWarpRows ? n : min(n, kPacks * int(blockDim.x) * kVec);
  Sums* const sums_w = reinterpret_cast<Sums*>(row_cache<A>(slot, share));
  Sums* const sums_b = reinterpret_cast<Sums*>(row_cache<A>(slots + slot, share));
  const bool params = a.partial_w != nullptr, bias = a.partial_b != nullptr;
  if (params)
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (threads.group(p) < groups) {
        sums_w[threads.local(p)] = Sums{};
        if (bias) sums_b[threads.local(p)] = Sums{};
      }
  VecN<P, kVec> scales[kPacks];
  if (a.weight) {
    if constexpr (std::is_same_v<P, T>) {
      load_packs(threads, reinterpret_cast<const Pack*>(a.weight), groups, scales);
    } else {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        scales[p] = threads.group(p) < groups ? load_param_pack<kVec>(a.weight + int64_t(threads.group(p)) * kVec)
                                              : VecN<P, kVec>{};
    }
  }
  const int64_t group_index = kWarpRows ? blockIdx.x * int64_t(slots) + slot : blockIdx.x / cluster_blocks();
  const int64_t first = group_index * a.rows_per_group;
  const int64_t last = first + a.rows_per_group < a.rows ? first + a.rows_per_group : a.rows;
  // A block walks its rows one after another: without a prefetch its loads
  // of a row wait for the previous row's reductions, dx and sums
  // (stage_packs). A row is staged after the row before has been read (its
  // last reduction's barrier orders the two).
  constexpr bool kCanPrefetch = !kWarpRows && sizeof(Pack) == 16;
  const bool prefetch = kCanPrefetch && a.prefetch;
  Pack* const stage_x = reinterpret_cast<Pack*>(row_cache<A>(2, share));
  Pack* const stage_dy = stage_x + share / kVec;
  auto stage_row = [&](int64_t row) {
    stage_packs<kPacks>(threads, groups, reinterpret_cast<const Pack*>(a.x + row * a.n), stage_x,
                        reinterpret_cast<const Pack*>(a.dy + row * a.n), stage_dy);
  };
  if (prefetch && first < last) stage_row(first);
  // Its address recomputed at each use: held through the row, it cost the
  // four-pack layer_norm kernels a spill.
  const auto staged_residual = [&](int p) {
    unsigned char* const end = row_cache<unsigned char>(0, 0) + dynamic_shared_bytes();
    return reinterpret_cast<Pack*>(end) - (slots - slot) * (share / kVec) + threads.local(p);
  };
  for (threads.row = first; threads.row < last; ++threads.row) {
    const int64_t offset = threads.row * a.n;
    Pack xs[kPacks], gs[kPacks];
    if (prefetch) {
      wait_async_copies();
      load_staged_packs(threads, stage_x, groups, xs);
      load_staged_packs(threads, stage_dy, groups, gs);
    } else {
      load_packs(threads, reinterpret_cast<const Pack*>(a.x + offset), groups, xs);
      load_packs(threads, reinterpret_cast<const Pack*>(a.dy + offset), groups, gs);
    }
    if constexpr (kStagedResidual) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (threads.group(p) < groups)
          copy16_async(staged_residual(p),
                       reinterpret_cast<const Pack*>(a.grad_residual + offset) + threads.group(p));
      commit_async_copies();
    }
    const A mu = row_mean<kCentered>(a.mean, threads.row), r = a.rstd[threads.row];
    auto xhat_at = [&](int p, int j) { return (static_cast<A>(xs[p].elem[j]) - mu) * r; };
    auto g_at = [&](int p, int j) {
      return a.weight ? static_cast<A>(gs[p].elem[j]) * static_cast<A>(scales[p].elem[j])
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
    A mean_g = 0, mean_gx;
    if constexpr (kCentered) {
      const GradientSums<A> row = threads.template allreduce<SumOp<GradientSums<A>>>(GradientSums<A>{sum_g, sum_gx});
      mean_g = row.g / static_cast<A>(n);
      mean_gx = row.gx / static_cast<A>(n);
    } else {
      mean_gx = threads.template allreduce<SumOp<A>>(sum_gx) / static_cast<A>(n);
    }
    if (prefetch && threads.row + 1 < last) stage_row(threads.row + 1);
    if constexpr (kStagedResidual) {
      commit_async_copies();  // the next row's copies, if any: left in flight
      wait_async_copies_but<1>();
    }
    Pack* const out = reinterpret_cast<Pack*>(a.dx + offset);
    // The residual gradient: float rows load all its packs at once here,
    // after the reductions (read at the store, each load waits for the
    // store before it, which may alias: float add + norm backwards 5-15%
    // slower on the H100). Two-byte rows of 16-byte packs stage it
    // (kStagedResidual), others read it at the store: their 4-pack kernels
    // are at 128 registers already.
    constexpr bool kResidualUpFront = std::is_same_v<T, float>;
    Pack residual_packs[kPacks];
    if constexpr (kResidualUpFront) {
      if (a.grad_residual)
        load_packs(threads, reinterpret_cast<const Pack*>(a.grad_residual + offset), groups, residual_packs);
    }
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = threads.group(p);
      if (g >= groups) continue;
      Pack carried{};
      if (a.grad_residual) {
        if constexpr (kResidualUpFront) carried = residual_packs[p];
        else if constexpr (kStagedResidual) carried = *staged_residual(p);
        else carried = reinterpret_cast<const Pack*>(a.grad_residual + offset)[g];
      }
      Pack result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        A v = r * (g_at(p, j) - mean_g - xhat_at(p, j) * mean_gx);
        if (a.grad_residual) v += static_cast<A>(carried.elem[j]);
        result.elem[j] = static_cast<T>(v);
      }
      out[g] = result;
      if (params) {
        const int mine = threads.local(p);
        Sums w = sums_w[mine];
#pragma unroll
        for (int j = 0; j < kVec; ++j) w.elem[j] += static_cast<A>(gs[p].elem[j]) * xhat_at(p, j);
        sums_w[mine] = w;
        if (bias) {
          Sums b = sums_b[mine];
#pragma unroll
          for (int j = 0; j < kVec; ++j) b.elem[j] += static_cast<A>(gs[p].elem[j]);
          sums_b[mine] = b;
        }
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
        if (bias) total_b += row_cache<A>(slots + k, n)[c];
      }
      a.partial_w[blockIdx.x * int64_t(n) + c] = total_w;
      if (bias) a.partial_b[blockIdx.x * int64_t(n) + c] = total_b;
    }
  } else {
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (threads.group(p) < groups) {
        reinterpret_cast<Sums*>(a.partial_w + group_index * n)[threads.group(p)] = sums_w[threads.local(p)];
        if (bias) reinterpret_cast<Sums*>(a.partial_b + group_index * n)[threads.group(p)] = sums_b[threads.local(p)];
      }
  }
}

// ---- Short rows of 16-byte packs, kPacks packs a lane (the residual added,
// h = x + residual rounded to T, where given): kLanes lanes a row (the
// fewest, a power of two, that hold it), so a warp holds kWarpSize / kLanes
// rows at a time, and each lane loads kShortRowSteps / kPacks rows' packs
// (one row's where kPacks > 2) before the first reduction. One row a warp,
// staged or in registers, kept a few hundred bytes a warp in flight and left
// lanes idle: row-count bound at head sizes (H200, bf16 rms_norm (262144,
// 128): 93 µs, now 35; a copy of the bytes 33). The mean and variance in two
// passes over the registers (no branch: the segments of a warp shuffle
// together). A warp's rows are consecutive, so their statistics are gathered
// into lanes and stored at once: a store a row cost layer_norm 2-3 µs of 37
// (bench/micro/head_rows.cu). kAdd: compiled for a given residual; kAffine:
// for every parameter given (layer_norm's weight and bias, rms_norm's
// weight), so that the output pass has no null checks.
template <typename T, int kLanes, typename Math, typename P = T, int kPacks = 1, bool kAdd = false,
          bool kAffine = false>
__global__ void __launch_bounds__(kShortRowWarps* kWarpSize)
    norm_forward_short_rows_kernel(NormForwardArgs<T, P> a) {
  constexpr bool kCentered = Math::kCentered;
  constexpr int kVec = Vec16<T>::kSize;
  using Place = ShortRowLane<kLanes, kPacks>;
  constexpr int kSegments = Place::kSegments, kRows = Place::kRows, kSteps = Place::kSteps;
  // Gathered statistics: lane i holds the warp's row i's (the rows fit the lanes).
  constexpr bool kGathered = kRows <= kWarpSize;
  using A = opmath_t<T>;
  const Place place;
  const int n = static_cast<int>(a.n);
  const auto in_row = [&](int q) { return place.column(q) < n / kVec; };
  const auto weighted = [&] { return kAffine || a.weight; };
  const auto biased = [&] { return kCentered && (kAffine || a.bias); };
  const auto at = [&](const T* base, int64_t row, int q) {
    return reinterpret_cast<const uint4*>(base + row * n) + place.column(q);
  };
  const auto to = [&](T* base, int64_t row, int q) {
    return reinterpret_cast<uint4*>(base + row * n) + place.column(q);
  };
  const auto value = [](const uint4& words, int j) { return word_element<T>(words, j); };
  // Zero packs past the row and the rows: they add nothing to a row's sum.
  const auto live = [&](int k, int q) { return in_row(q) && place.row(k) < a.rows; };
  // The packs as words: typed as two-byte fields they are split into 16-bit
  // registers as they land (bfloat16: 78-90 registers, 54-64 as words).
  uint4 packs[kSteps][kPacks];
#pragma unroll
  for (int k = 0; k < kSteps; ++k)
#pragma unroll
    for (int q = 0; q < kPacks; ++q) packs[k][q] = live(k, q) ? *at(a.x, place.row(k), q) : uint4{};
  if constexpr (kAdd) {
    uint4 adds[kSteps][kPacks];
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
#pragma unroll
      for (int q = 0; q < kPacks; ++q) adds[k][q] = live(k, q) ? *at(a.residual, place.row(k), q) : uint4{};
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
#pragma unroll
      for (int q = 0; q < kPacks; ++q) {
        A sums[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) sums[j] = value(packs[k][q], j) + value(adds[k][q], j);
        packs[k][q] = words_of<T>(sums);
        if (live(k, q)) *to(a.residual_out, place.row(k), q) = packs[k][q];
      }
  }
  VecN<P, kVec> scale[kPacks], shift[kPacks];
#pragma unroll
  for (int q = 0; q < kPacks; ++q) {
    if (weighted() && in_row(q)) scale[q] = load_param_pack<kVec>(a.weight + place.column(q) * kVec);
    if (biased() && in_row(q)) shift[q] = load_param_pack<kVec>(a.bias + place.column(q) * kVec);
  }
  const auto row_sum = [](A v) { return warp_allreduce<SumOp<A>, kLanes>(v); };
  A lane_mean = 0, lane_rstd = 0;
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    A mean = 0, squares = 0;
    if constexpr (kCentered) {
      A sum = 0;
#pragma unroll
      for (int q = 0; q < kPacks; ++q)
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += value(packs[k][q], j);
      mean = row_sum(sum) / static_cast<A>(n);
    }
#pragma unroll
    for (int q = 0; q < kPacks; ++q)
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A d = value(packs[k][q], j) - mean;
        squares += in_row(q) ? d * d : A(0);
      }
    const A rstd = rsqrt_acc(row_sum(squares) / static_cast<A>(n) + a.eps);
    if constexpr (kGathered) {
      // Lanes [k * kSegments, (k + 1) * kSegments) take this step's rows, one
      // a segment, from the segment's first lane.
      const int from = (place.lane % kSegments) * kLanes;
      const A step_mean = kCentered ? __shfl_sync(kFullMask, mean, from) : A(0);
      const A step_rstd = __shfl_sync(kFullMask, rstd, from);
      if (place.lane / kSegments == k) lane_mean = step_mean, lane_rstd = step_rstd;
    }
    const int64_t row = place.row(k);
    if (row >= a.rows) continue;
    const RowNormalizer<T, A> normalize(mean, rstd);
#pragma unroll
    for (int q = 0; q < kPacks; ++q) {
      if (!in_row(q)) continue;
      A out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out[j] = normalize(value(packs[k][q], j));
        if (weighted()) out[j] *= element(scale[q], j);
        if (biased()) out[j] += element(shift[q], j);
      }
      *to(a.y, row, q) = words_of<T>(out);
    }
    if (!kGathered && place.lane % kLanes == 0) {
      if constexpr (kCentered) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
  if constexpr (kGathered) {
    const int64_t row = place.warp_rows + place.lane;
    if (place.lane < kRows && row < a.rows) {
      if constexpr (kCentered) a.mean[row] = lane_mean;
      a.rstd[row] = lane_rstd;
    }
  }
}

// Sums each lane's value over the lanes kWidth, 2 * kWidth, ... apart (the
// same lane of every aligned group of kWidth), in a fixed order.
template <int kWidth, typename Acc>
__device__ __forceinline__ Acc warp_segments_sum(Acc value) {
#pragma unroll
  for (int offset = kWidth; offset < kWarpSize; offset *= 2) value += shuffle_xor(value, offset);
  return value;
}

// The backward of those rows (any residual gradient added): block b takes
// rows [b * rows_per_group, (b + 1) * rows_per_group), each warp
// kShortRowSteps rows a segment at a time; with `partial_w` each lane sums
// dy * xhat (and dy) of its column over its rows, and the block writes one
// partial row of each, its segments and then its warps added in a fixed
// order.
template <typename T, int kLanes, typename Math, typename P = T>
__global__ void __launch_bounds__(kWarpRowsPerBlock* kWarpSize)
    norm_backward_short_rows_kernel(NormBackwardArgs<T, P> a) {
  constexpr bool kCentered = Math::kCentered;
  constexpr int kVec = Vec16<T>::kSize, kSegments = kWarpSize / kLanes, kTile = kSegments * kShortRowSteps;
  using A = opmath_t<T>;
  using Pack = Vec16<T>;
  __shared__ A totals[2][kWarpRowsPerBlock][kLanes * kVec];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, column = lane % kLanes;
  const int n = static_cast<int>(a.n);
  const bool in_row = column < n / kVec, params = a.partial_w != nullptr, bias = a.partial_b != nullptr;
  const int64_t begin = blockIdx.x * a.rows_per_group;
  const int64_t end = begin + a.rows_per_group < a.rows ? begin + a.rows_per_group : a.rows;
  VecN<P, kVec> scale{};  // zeros past the row: its zero packs' g must stay 0 in the row's sums
  if (a.weight && in_row) scale = load_param_pack<kVec>(a.weight + column * kVec);
  A sums_w[kVec] = {}, sums_b[kVec] = {};
  for (int64_t tile = begin + int64_t(warp) * kTile; tile < end; tile += int64_t(kWarpRowsPerBlock) * kTile) {
    const auto row_at = [&](int k) { return tile + int64_t(k) * kSegments + lane / kLanes; };
    Pack xs[kShortRowSteps], gs[kShortRowSteps];
#pragma unroll
    for (int k = 0; k < kShortRowSteps; ++k) {
      const bool live = in_row && row_at(k) < end;
      xs[k] = live ? reinterpret_cast<const Pack*>(a.x + row_at(k) * n)[column] : Pack{};
      gs[k] = live ? reinterpret_cast<const Pack*>(a.dy + row_at(k) * n)[column] : Pack{};
    }
#pragma unroll
    for (int k = 0; k < kShortRowSteps; ++k) {
      const int64_t row = row_at(k);
      const bool live = row < end;
      const A mu = live ? row_mean<kCentered>(a.mean, row) : A(0), r = live ? a.rstd[row] : A(0);
      A g[kVec], xhat[kVec], sum_g = 0, sum_gx = 0;  // zero packs past the row add nothing
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        g[j] = static_cast<A>(gs[k].elem[j]) * (a.weight ? static_cast<A>(scale.elem[j]) : A(1));
        xhat[j] = (static_cast<A>(xs[k].elem[j]) - mu) * r;
        sum_g += g[j];
        sum_gx += g[j] * xhat[j];
      }
      const A mean_g = kCentered ? warp_allreduce<SumOp<A>, kLanes>(sum_g) / static_cast<A>(n) : A(0);
      const A mean_gx = warp_allreduce<SumOp<A>, kLanes>(sum_gx) / static_cast<A>(n);
      if (!live || !in_row) continue;
      Pack carried{}, out;
      if (a.grad_residual) carried = reinterpret_cast<const Pack*>(a.grad_residual + row * n)[column];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        A v = r * (g[j] - mean_g - xhat[j] * mean_gx);
        if (a.grad_residual) v += static_cast<A>(carried.elem[j]);
        out.elem[j] = static_cast<T>(v);
        sums_w[j] += static_cast<A>(gs[k].elem[j]) * xhat[j];
        sums_b[j] += static_cast<A>(gs[k].elem[j]);
      }
      reinterpret_cast<Pack*>(a.dx + row * n)[column] = out;
    }
  }
  if (!params) return;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    sums_w[j] = warp_segments_sum<kLanes>(sums_w[j]);
    sums_b[j] = warp_segments_sum<kLanes>(sums_b[j]);
  }
  if (lane < kLanes) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      totals[0][warp][lane * kVec + j] = sums_w[j];
      totals[1][warp][lane * kVec + j] = sums_b[j];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    A total_w = 0, total_b = 0;
    for (int w = 0; w < kWarpRowsPerBlock; ++w) {
      total_w += totals[0][w][c];
      total_b += totals[1][w][c];
    }
    a.partial_w[blockIdx.x * int64_t(n) + c] = total_w;
    if (bias) a.partial_b[blockIdx.x * int64_t(n) + c] = total_b;
  }
}

// ---- Short rows staged in shared memory, one warp each (no residual: the
// launcher takes fused adds to the register kernel).
template <typename T, int kVec, typename Math>
__global__ void __launch_bounds__(kWarpRowsPerBlock* kWarpSize, kStagedMinBlocks<T>)
    norm_forward_staged_kernel(NormForwardArgs<T> a) {
  constexpr bool kCentered = Math::kCentered;
  using A = opmath_t<T>;
  const int64_t row = warp_row(a.rows);
  if (row < 0) return;
  const int n = static_cast<int>(a.n);
  T* const stage = row_cache<T>(threadIdx.x / kWarpSize, n);  // the warp's slot
  stage_warp_row<kVec>(stage, a.x + row * n, n);
  A mean;
  const A rstd = row_rstd<kCentered>(
      n, a.eps, static_cast<A>(stage[0]), [&](auto f) { for_each_staged<kVec, A>(stage, n, f); },
      [](auto v) { return warp_allreduce<SumOp<decltype(v)>>(v); }, mean);
  map_staged<kVec, A>(stage, a.y + row * n, n, [&](int first, A(&v)[kVec]) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = (v[j] - mean) * rstd;
    if (a.weight) apply_params(a.weight, first, v, [](A x, A w) { return x * w; });
    if (a.bias) apply_params(a.bias, first, v, [](A x, A b) { return x + b; });
  });
  if (threadIdx.x % kWarpSize == 0) {
    if constexpr (kCentered) a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

}  // namespace fastreduce
