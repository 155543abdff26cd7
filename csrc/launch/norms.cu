#include "norms.h"

#include <algorithm>
#include <tuple>
#include <type_traits>

#include "../kernels/column_fold.cuh"
#include "../kernels/norm_kernels.cuh"
#include "../kernels/norm_loose_kernels.cuh"
#include "../kernels/normalize_kernels.cuh"
#include "launch.h"
#include "rows.h"

namespace fastreduce {
namespace {

using namespace rows;

// Weight and bias gradients come in two stages: partial rows, then a column
// sum of them. Stage one is fused into the dx kernel where the rows are in
// registers: rows of up to kWarpRowMax in one wave of at most
// kFusedBlocksPerSm blocks, each folding its rows into one partial row (its
// shared memory holds every warp's sums); longer rows in a few blocks per SM
// (kLongRowWarpsPerSm) of consecutive rows each. Otherwise (rows too long
// for registers or shared memory) a separate pass reads x and dy. Stage two
// is one launch for both parameters, a programmatic dependent of stage one
// (cheaper than column sums and casts in separate launches, or a grid-wide
// barrier and fold at the end of a cooperative dx kernel).
constexpr int kFusedBlocksPerSm = 2;
// Long rows: enough blocks for about kLongRowWarpsPerSm warps per SM, 2 to 8
// blocks (a fixed block count per SM suits one row width and not another).
constexpr int kLongRowWarpsPerSm = 16;
struct ParamGradPlan {
  bool fused;
  int64_t chunks;          // partial rows
  int64_t rows_per_chunk;  // rows per warp or block of the dx kernel when fused, per chunk of the separate pass
  size_t shared_bytes;     // fused only
  size_t partial_bytes;    // each of the two partial buffers
  bool prefetch = false;   // block rows: shared_bytes include the next row's stage
  int cluster = 0;         // rows past one block: blocks per cluster (chunks: at most one per SM share)
  int packs = 0;           // rows past one block: packs a thread holds
};

// Packs a thread of the backward's clusters may hold: float rows past 16
// blocks of 4 packs (131072 floats) take 8, spilling 132-136 bytes: still
// 10-12% faster than the block kernel, which reads the row twice (H100,
// (512, 262144): 1381 -> 1241 µs), and with the parameter gradients summed
// on the way 27% faster again (1234 -> 902 µs; a separate pass read x and dy
// again). Two-byte rows of 4 packs are at 128 registers.
template <typename T>
constexpr int kBackwardMaxPacks = sizeof(T) == 4 ? 8 : 4;

// Bytes of one buffer of `chunks` partial rows, each of n accumulators.
size_t partial_row_bytes(int64_t chunks, int64_t n, size_t acc) { return (chunks * n * acc + 255) / 256 * 256; }

// The parameter gradients' partial rows in a pass of their own
// (norm_backward_params_kernel), where the dx kernel cannot sum them.
ParamGradPlan separate_pass_plan(int64_t rows, int64_t n, size_t acc, int sm_count) {
  const int64_t tiles = ceil_div(n, kGradTile);
  const int64_t chunks = std::max<int64_t>(1, std::min(ceil_div(int64_t(sm_count) * 8, tiles), ceil_div(rows, 64)));
  return {false, chunks, ceil_div(rows, chunks), 0, partial_row_bytes(chunks, n, acc)};
}

// `acc`: bytes per accumulator; `vec`: the elements per pack the dx kernel will load (1 where the buffers
// are not 16-byte packable); `max_packs`: the most packs a thread of its clusters holds; `residual_stage`:
// the bytes a block stages its rows' residual gradient in (residual_stage_bytes).
ParamGradPlan param_grad_plan(int64_t rows, int64_t n, size_t acc, int vec, int max_packs, int sm_count,
                              size_t residual_stage = 0) {
  auto partial_bytes = [&](int64_t chunks) { return partial_row_bytes(chunks, n, acc); };
  DeviceLimits limits;
  const bool known = device_limits(limits) == cudaSuccess;
  const int per_block = limits.shared_per_block, per_sm = limits.shared_per_sm;
  const size_t slot_bytes = (n * acc + 15) / 16 * 16;  // one row_cache() slot
  if (n <= kWarpRowMax) {
    const size_t shared = 2 * kWarpRowsPerBlock * slot_bytes + residual_stage;
    if (known && shared + kStaticSharedBytes <= size_t(per_block)) {
      // Each block also takes the 1 KiB the hardware reserves.
      const int64_t blocks_per_sm =
          std::clamp<int64_t>(per_sm / (shared + kStaticSharedBytes + 1024), 1, kFusedBlocksPerSm);
      const int64_t chunks = std::min(warp_row_blocks(rows), sm_count * blocks_per_sm);
      return {true, chunks, ceil_div(rows, chunks * kWarpRowsPerBlock), shared, partial_bytes(chunks)};
    }
  } else {
    const size_t shared = 2 * slot_bytes + residual_stage;
    if (known && block_lane_threads(n / vec) != 0 && shared + kStaticSharedBytes <= size_t(per_block)) {
      const int warps = block_lane_threads(n / vec) / kWarpSize;
      // No more blocks than the SM's shared memory holds: a second wave of
      // them would walk its rows without the prefetch.
      const int64_t blocks_per_sm = std::min<int64_t>(std::clamp(kLongRowWarpsPerSm / warps, 2, 8),
                                                      std::max<int64_t>(1, per_sm / (shared + kStaticSharedBytes + 1024)));
      const int64_t rows_per_chunk = ceil_div(rows, std::min<int64_t>(rows, sm_count * blocks_per_sm));
      const int64_t chunks = ceil_div(rows, rows_per_chunk);
      // The next row's x and dy staged too (16-byte packs), where the SM
      // still holds blocks_per_sm blocks with it.
      const size_t staged = shared + 2 * n * (16 / vec);
      const bool prefetch = vec > 1 && rows_per_chunk > 1 && staged + kStaticSharedBytes <= size_t(per_block) &&
                            blocks_per_sm * (staged + kStaticSharedBytes + 1024) <= size_t(per_sm);
      return {true, chunks, rows_per_chunk, prefetch ? staged : shared, partial_bytes(chunks), prefetch};
    }
    // Rows past one block: a cluster of blocks (as with_cluster_lanes
    // picks it) per chunk, one cluster per cluster-sized share of the SMs,
    // each block's sums and stage covering its share of the row (8 packs a
    // thread: 128 KiB of sums, no room for the stage).
    const ClusterLanes lanes = cluster_lanes(n / vec, max_packs);
    const int64_t block_packs = int64_t(kRowThreadsMax) * lanes.packs;
    const size_t share_shared = 2 * block_packs * vec * acc;
    const size_t share_staged = share_shared + 2 * block_packs * 16;
    if (known && vec > 1 && block_lane_threads(n / vec) == 0 && lanes.cluster != 0 && cluster_launch_supported() &&
        share_shared + kStaticSharedBytes <= size_t(per_block)) {
      const int64_t rows_per_chunk = ceil_div(rows, std::min<int64_t>(rows, std::max(1, sm_count / lanes.cluster)));
      const int64_t chunks = ceil_div(rows, rows_per_chunk);
      const bool prefetch = rows_per_chunk > 1 && share_staged + kStaticSharedBytes <= size_t(per_block);
      const size_t shared_bytes = prefetch ? share_staged : share_shared;
      return {true, chunks, rows_per_chunk, shared_bytes, partial_bytes(chunks), prefetch, lanes.cluster, lanes.packs};
    }
  }
  return separate_pass_plan(rows, n, acc, sm_count);
}

// The rows of `a` with the residual already added: h = x + residual in a
// separate pass, for the kernels that do not fuse the add.
template <typename T, typename P>
cudaError_t add_residual_first(NormForwardArgs<T, P>& a, cudaStream_t stream) {
  if (!a.residual) return cudaSuccess;
  const int64_t count = a.rows * a.n;
  const int64_t blocks = std::min<int64_t>(ceil_div(count, 256), 16384);
  add_residual_kernel<T><<<blocks, 256, 0, stream>>>(a.x, a.residual, a.residual_out, count);
  a.x = a.residual_out;
  a.residual = nullptr;
  return cudaGetLastError();
}

// Rows past a warp that are not whole 16-byte packs in every buffer but
// start as far from a 16-byte boundary in each of `rows` (odd widths, or
// parameters that are not packs): the loose kernels (norm_loose_kernels.cuh),
// a block a row of up to four packs a thread, when that holds them. The
// threads a block, 0 where they do not take the rows. H200, bf16 (8192,
// 4095), kernel µs, the block rows -> these: rms_norm forward 75.4 -> 32.6,
// layer_norm 85.3 -> 39.1 (bench/peers.py; docs/design.md).
template <typename T>
int loose_row_threads(int64_t n, std::initializer_list<const void*> rows) {
  constexpr int kVec = Vec16<T>::kSize;
  if (sizeof(T) > 4 || n <= kWarpRowMax || !same_pack_offset(rows)) return 0;
  return block_lane_threads(loose_row_packs<kVec>(n));
}
// The packs a thread of those kernels holds: three or four.
template <typename T>
int loose_row_packs_per_thread(int64_t n, int threads) {
  return ceil_div(loose_row_packs<Vec16<T>::kSize>(n), int64_t(threads)) <= 3 ? 3 : 4;
}
// The loose forward for its packs a thread, layer_norm's two-byte rows with
// both parameters compiled for them (H200, bf16 (8192, 4095), kernel µs:
// 40.8 -> 39.1-39.4 in three runs, bench/peers.py; NOTES.md).
template <typename T, typename Math, typename P>
auto loose_forward_for(bool affine) {
  return [affine](auto packs) {
    constexpr int kPacks = decltype(packs)::value;
    if constexpr (Math::kCentered && sizeof(T) == 2)
      if (affine) return norm_forward_loose_kernel<T, kPacks, Math, P, true>;
    return norm_forward_loose_kernel<T, kPacks, Math, P>;
  };
}
// kernel_for(kPacks) in `blocks` blocks for rows of n.
template <typename T, typename KernelFor, typename Args>
cudaError_t launch_loose_rows(KernelFor&& kernel_for, int64_t blocks, int64_t n, int threads, size_t shared,
                              cudaStream_t stream, const Args& args) {
  auto launch = [&](auto kernel) {
    if (const cudaError_t set = allow_shared_bytes(kernel, shared); set != cudaSuccess) return set;
    std::apply([&](auto... a) { kernel<<<blocks, threads, shared, stream>>>(a...); }, args);
    return cudaGetLastError();
  };
  if (loose_row_packs_per_thread<T>(n, threads) == 3) return launch(kernel_for(std::integral_constant<int, 3>{}));
  return launch(kernel_for(std::integral_constant<int, 4>{}));
}

// The loose backward's parameter gradients: in its blocks (as many as
// param_grad_plan gives packed rows of n, each taking a run of one class of
// rows loose_row_period apart) where there are at least as many as classes
// and its slots fit (the weight's sums, the bias's with a bias, the shifted
// weight of `param_bytes` an element), else in the separate pass. The next
// row's x and dy staged too, for two-byte rows, where the SM still holds the
// blocks it gets (H200, kernel µs, fwd+bwd: bf16 rms_norm (8192, 4095) 119.6
// -> 109.1, (4096, 8191) 126.1 -> 117.1; float32 rows 2-4% slower with it).
template <typename T>
ParamGradPlan loose_param_grad_plan(int64_t rows, int64_t n, int threads, bool bias, size_t param_bytes,
                                    int sm_count) {
  using A = opmath_t<T>;
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t period = loose_row_period<T>(n);
  const ParamGradPlan packed = param_grad_plan(rows, n, sizeof(A), kVec, kBackwardMaxPacks<T>, sm_count);
  const size_t slots = size_t(threads) * loose_row_packs_per_thread<T>(n, threads);
  const size_t shared = slots * kVec * ((bias ? 2 : 1) * sizeof(A) + param_bytes);
  DeviceLimits limits;
  if (!packed.fused || packed.cluster || packed.chunks < period || device_limits(limits) != cudaSuccess ||
      shared + kStaticSharedBytes > size_t(limits.shared_per_block))
    return separate_pass_plan(rows, n, sizeof(A), sm_count);
  const int64_t class_rows = ceil_div(rows, period);
  const int64_t rows_per_chunk = ceil_div(class_rows, packed.chunks / period);
  const int64_t chunks = period * ceil_div(class_rows, rows_per_chunk);
  const size_t staged = shared + 2 * slots * 16;
  const int64_t blocks_per_sm = ceil_div(chunks, int64_t(sm_count));
  const bool prefetch = sizeof(T) == 2 && rows_per_chunk > 1 &&
                        staged + kStaticSharedBytes <= size_t(limits.shared_per_block) &&
                        blocks_per_sm * (staged + kStaticSharedBytes + 1024) <= size_t(limits.shared_per_sm);
  return {true, chunks, rows_per_chunk, prefetch ? staged : shared, partial_row_bytes(chunks, n, sizeof(A)), prefetch};
}

// Two-byte rows without a residual, 16-byte aligned, of 3 to kHalfWarpPacksMax
// packs a lane (513-1792 wide): a warp a row in registers, the parameters
// loaded pack by pack and the add's code compiled out (58 registers at seven
// packs, not 82). H200, bf16, µs, against the staged warp rows (up to 1024)
// and the one-row blocks: layer_norm (32768, 1024) 37.2 -> 34.6, (16384,
// 1280) 25.8 -> 23.4, (8192, 1600) 18.5 -> 16.9, (8192, 768) 10.4 both;
// rms_norm (8192, 768) 9.6 -> 9.0, (32768, 1024) 34.6 -> 33.4, (16384, 1280)
// 22.7 -> 21.9, (8192, 1600) 15.9 -> 16.1; at eight packs (2048) 1-2% either
// way, so those stay in blocks (bench/micro/short_rows.cu). Rows of up to two
// packs a lane were not measured and stay staged.
constexpr int kHalfWarpPacksMin = 3, kHalfWarpPacksMax = 7;

// The one count of those packs at which rows of exactly that many a lane run
// a kernel compiled for them (kFullRow: no pack guarded): layer_norm's three
// (768 wide, both parameters given), rms_norm's six (1536). H200, bf16, µs,
// two passes (bench/micro/full_rows.cu): layer_norm (8192, 768) 10.1 / 10.2
// -> 9.8 / 9.8, rms_norm (8192, 1536) 15.7 / 15.6 -> 14.7 / 14.7. At the other
// counts it ties or loses up to 11% (more registers: layer_norm (4096, 1792)
// 64 -> 80, 10.7 -> 11.8), and the fused add's rows gain nothing.
template <bool kCentered>
constexpr int kFullRowPacks = kCentered ? 3 : 6;

// Rows norm_forward_reread_kernel takes (no residual, 16-byte aligned), up
// to kRereadRowMax. Two-byte rows, four packs a thread: rms_norm's from
// kRereadRowMax / 4 + 1, layer_norm's bf16 ones from kRereadRowMax / 2 + 1;
// the L2 keep hint past kRereadRowMax / 2. layer_norm's float16 rows stay in
// registers: its kernel takes 47-50 registers (bf16's 39-47), two blocks an
// SM at 16384 (H200, µs, in registers -> read twice: (8192, 16384) 136.3 ->
// 143.3, (4096, 8192) 35.5 -> 37.4). Float rows of both norms from
// kRereadRowMax / 2, keeping the row in L2, eight packs a thread past it.
// H200 (a probe of bench/micro/reread_rows.cu's kind, NOTES), µs, the
// launcher (the row in registers, a cluster of two past 8192) -> read twice:
// rms_norm (8192, 8192) 129.2-129.9 -> 126.5-126.8, (8192, 12000) 190.5-191.7
// -> 186.7-188.7, (8192, 16384) 256.4-258.6 -> 250.7-251.6; layer_norm
// 129.4-130.2 -> 126.4-126.8, 216.2-217.3 -> 185.9-186.1, 270.4-271.9 ->
// 253.8-255.2. (8192, 6000) and (8192, 4096) tie; rows read in chunks past
// 16384 lost (32768: 264 -> 287).
constexpr int64_t kRereadRowMax = 16384;
template <typename T, typename Math>
constexpr int64_t kRereadRowMin = sizeof(T) == 4 ? kRereadRowMax / 2
                                  : Math::kCentered ? kRereadRowMax / 2 + 1
                                                    : kRereadRowMax / 4 + 1;
// Loose rows (row_io.cuh's PackedRow: odd widths, or rows off a 16-byte
// boundary) read twice: rms_norm's and float layer_norm's from
// kRereadRowMax / 4 + 1, bf16 layer_norm's from kRereadRowMin as aligned
// ones. Eight packs a thread past kRereadRowMax / 2 and for float
// layer_norm (at four, its 58 registers leave two blocks of 512 an SM; at
// eight, four of 256), the L2 keep hint where aligned rows take it. H200,
// kernel µs, in registers (the launcher) -> read twice
// (bench/micro/loose_reread.cu, two runs): float32 rms_norm (4096, 8191)
// 66.8 -> 65.9-66.2, (8192, 6001) 105.6 -> 94.4-94.5, (8192, 12001) 258.4
// -> 185.5-185.7, (8192, 16383) 334.5 -> 253.9-254.8; layer_norm 77.0 ->
// 71.4-72.1, 121.5 -> 98.9-99.1, 270.7 -> 204.1-204.4, 351.5 ->
// 283.9-284.2; bf16 rms_norm (8192, 6001) 52.8 -> 48.8-49.0, (4096, 8191)
// 34.7 -> 33.9-34.0, (8192, 12001) 113.6 -> 95.5-95.6, (8192, 16383) 140.2
// -> 129.9-130.1; layer_norm (8192, 12001) 123.4 -> 110.4-110.6, (8192,
// 16383) 151.3 -> 145.3-145.4. At (8192, 4095) float rows lost 2-4% and
// bf16 rms_norm tied; bf16 layer_norm rows of 4095-8191 lost 6-10%.
template <typename T, typename Math>
constexpr int64_t kLooseRereadRowMin = sizeof(T) == 2 && Math::kCentered ? kRereadRowMin<T, Math>
                                                                         : kRereadRowMax / 4 + 1;
template <typename T, typename Math>
constexpr bool kReadsTwice = std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> ||
                             (std::is_same_v<T, __half> && !Math::kCentered);

// Rows in registers a warp each run four to a block: float rows take about
// 93 registers at width 768, so 20 warps an SM in four-warp blocks and 16 in
// eight-warp ones.
constexpr int kRegisterRowsPerBlock = 4;

// Two-byte rows with the fused add, 16-byte aligned, that run a warp a row
// with the residual staged (ResidualAdd::kStaged): 5-7 packs a lane
// (1025-1792 wide, one-row blocks before), and rms_norm's two and three (its
// parameters per pack: 31-32 registers, 16 blocks an SM). H200, bf16, µs,
// against the one-row blocks or the residual in registers
// (bench/micro/staged_add.cu): add_layer_norm (16384, 1280) 44.2 -> 42.1,
// (8192, 1600) 28.7 -> 28.2, (4096, 1792) 17.8 -> 16.2; add_rms_norm (8192,
// 512) 11.6 -> 10.7, (8192, 768) 14.7 -> 14.2, (16384, 1280) 42.0 -> 41.2,
// (8192, 1600) 27.8 -> 27.0, (4096, 1792) 17.1 -> 17.3. Four packs and
// layer_norm's two and three gained nothing.
template <bool kCentered>
using StagedAddPacks =
    std::conditional_t<kCentered, std::integer_sequence<int, 5, 6, 7>, std::integer_sequence<int, 2, 3, 5, 6, 7>>;

// Rows of up to a 16-byte pack a lane (two-byte ones up to 256 wide, float
// up to 128), 16-byte aligned: several rows a warp, kShortRowSteps a lane in
// flight, forward (norm_forward_short_rows_kernel) and backward
// (norm_backward_short_rows_kernel). H200, 2^25 elements, µs, a warp a row
// staged -> several rows a warp (a copy of the bytes: 33): bf16 rms_norm
// n = 64 180.7 -> 35.5, 128 93.3 -> 35.6, 256 49.0 -> 35.7; layer_norm 212.1
// -> 39.5, 109.5 -> 39.8, 56.8 -> 40.5; add_rms_norm n = 64 124 -> 69, 128
// 72 -> 69 (at 256 the register kernel keeps the forward with the add: 66,
// against 74); forward + backward, rms_norm n = 128 177.9 -> 94.5, 256 119.0
// -> 96.6, layer_norm 205.3 -> 102.5, 141.2 -> 104.9. float32, 2^24
// elements (copy 33): rms_norm n = 32 83.8 -> 36.0, 64 44.6 -> 35.1, 128
// 34.9 -> 35.5; forward + backward 277.5 -> 96.2, 155.9 -> 94.1, 109.4 ->
// 94.2 (NOTES). takes_short_rows (rows.h) says which rows those are. Then
// blocks of four warps and the statistics stored a warp at a time: bf16
// layer_norm 39.4 / 39.8 / 40.1 -> 37.9 / 38.3 / 37.6, rms_norm 35.3 / 35.2 /
// 35.9 -> 34.8 / 34.5 / 34.7 (64 / 128 / 256).
// Two-byte rows of 257-512 without the add run the forward at two or three
// packs a lane: bf16 rms_norm 384 45 -> 34.9 µs, 512 37 -> 34.5 (a copy
// 35.6 and 33.1), layer_norm 37.8 and 36.1 (the staged warp rows before).
template <typename T>
constexpr bool kShortRowsPastAPack = sizeof(T) == 2;

template <typename T, typename P>
bool forward_takes_short_rows(const NormForwardArgs<T, P>& a) {
  const int64_t widest = a.residual               ? int64_t(kWarpSize / 2) * Vec16<T>::kSize
                         : kShortRowsPastAPack<T> ? int64_t(2 * kWarpSize) * Vec16<T>::kSize
                                                 : int64_t(kWarpSize) * Vec16<T>::kSize;
  return a.n <= widest && sizeof(T) <= 4 &&
         packable<T>(a.n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias});
}

// Every parameter given (layer_norm's weight and bias, rms_norm's weight):
// the kernels compiled for that (kAffine) have no null checks.
template <typename Math, typename T, typename P>
bool every_param_given(const NormForwardArgs<T, P>& a) {
  return a.weight && (!Math::kCentered || a.bias);
}

// The rows a block of the short-row backward takes at a time.
template <int kLanes>
constexpr int64_t kShortRowsPerBlock = int64_t(kWarpRowsPerBlock) * kShortRowsPerWarp<kLanes>;

// Rows past a pack a lane (two-byte rows of 257-512, never with the add): 16
// lanes of three packs up to 384, 32 lanes of two past it. The kernels are
// compiled for the residual given (kAdd) or every parameter given (kAffine),
// as the register rows are: the run-time checks and the add's code cost
// layer_norm bf16 (262144, 128) 0.7 µs, (131072, 256) 1.1 (of 35-36; H200,
// bench/micro/head_rows.cu); rms_norm's nothing measurable.
template <typename T, typename Math, typename P>
cudaError_t short_rows_forward(const NormForwardArgs<T, P>& a, cudaStream_t stream) {
  const bool affine = every_param_given<Math>(a);
  const auto launch = [&](auto plain, auto given, int rows_per_warp) {
    return launch_short_rows(affine ? given : plain, a.rows, rows_per_warp, stream, std::make_tuple(a));
  };
  const int64_t groups = a.n / Vec16<T>::kSize;
  if constexpr (kShortRowsPastAPack<T>)
    if (groups > kWarpSize) {
      if (groups <= 48)
        return launch(norm_forward_short_rows_kernel<T, 16, Math, P, 3>,
                      norm_forward_short_rows_kernel<T, 16, Math, P, 3, false, true>, kShortRowsPerWarp<16, 3>);
      return launch(norm_forward_short_rows_kernel<T, kWarpSize, Math, P, 2>,
                    norm_forward_short_rows_kernel<T, kWarpSize, Math, P, 2, false, true>,
                    kShortRowsPerWarp<kWarpSize, 2>);
    }
  return with_short_row_lanes<T>(a.n, [&](auto lanes) {
    constexpr int kLanes = decltype(lanes)::value;
    if constexpr (kLanes < kWarpSize)  // the add's rows fit 16 lanes (forward_takes_short_rows)
      if (a.residual)
        return launch_short_rows(norm_forward_short_rows_kernel<T, kLanes, Math, P, 1, true>, a.rows,
                                 kShortRowsPerWarp<kLanes>, stream, std::make_tuple(a));
    return launch(norm_forward_short_rows_kernel<T, kLanes, Math, P>,
                  norm_forward_short_rows_kernel<T, kLanes, Math, P, 1, false, true>, kShortRowsPerWarp<kLanes>);
  });
}

template <typename T, typename Math>
cudaError_t forward_rows(NormForwardArgs<T> a, cudaStream_t stream) {
  using A = opmath_t<T>;
  constexpr bool kHalfType = sizeof(T) == 2;
  const int64_t n = a.n;
  // Without a residual, some register rows run their kAffine kernels.
  const bool affine = !a.residual && every_param_given<Math>(a);
  // Warp rows with the add: layer_norm's two-byte ones load their parameters
  // a pack ahead of each store (H200, add_layer_norm bf16, µs: with the row
  // -> per pack -> ahead, (8192, 768) 16.0 -> 15.7 -> 15.1-15.3, (32768,
  // 1024) 68.1 -> 67.4 -> 66.8; rms_norm's and the float rows' ahead gain
  // nothing or lose: bench/micro/param_loads.cu).
  constexpr ParamLoads kParams = kHalfType && Math::kCentered ? ParamLoads::kAhead : ParamLoads::kWithRow;
  if constexpr (sizeof(T) <= 4)
    if (forward_takes_short_rows(a)) return short_rows_forward<T, Math>(a, stream);
  if constexpr (kHalfType) {
    constexpr int kVec = Vec16<T>::kSize;
    const int64_t packs = ceil_div(n, int64_t(kWarpSize) * kVec);
    if (!a.residual && packs >= kHalfWarpPacksMin && packs <= kHalfWarpPacksMax &&
        packable<T>(n, {a.x, a.y, a.weight, a.bias}))
      return with_exact_count(packs, std::integer_sequence<int, 3, 4, 5, 6, 7>{}, [&](auto count) {
        constexpr int kPacks = decltype(count)::value;
        // rms_norm loads its weight with the row, in the kernel compiled
        // with the add's code (no residual is given): its residual branch
        // keeps ptxas from scheduling the guarded row packs' field moves,
        // which wait for the row's loads, ahead of the weight's loads (SASS
        // of the seven-pack kernel without the add: the weight loads issue
        // after about 60 such moves, so after the row has landed). H100,
        // bf16, µs, per pack -> with the row and the add's code
        // (bench/micro/param_loads.cu, alternating rounds): (8192, 1600) 19.3
        // -> 17.5, (8192, 768) 10.5 -> 10.2, (32768, 1024) 43.7 -> 43.7; with
        // the row, the add compiled out: 18.7, 11.0, 44.0.
        constexpr ParamLoads kLoads = Math::kCentered ? ParamLoads::kPerPack : ParamLoads::kWithRow;
        constexpr ResidualAdd kAdd = Math::kCentered ? ResidualAdd::kNone : ResidualAdd::kInRegisters;
        auto kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kLoads, kAdd>;
        // layer_norm with both parameters: compiled knowing so (3-4 packs: 48
        // -> 40 registers). H200, bf16, µs: (8192, 768) 10.3 -> 10.2, (32768,
        // 1024) 34.7 -> 33.7, (16384, 1280) 23.7 -> 22.5, (8192, 1600) 16.8 ->
        // 16.4 (bench/micro/affine_rows.cu).
        if constexpr (Math::kCentered)
          if (affine)
            kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack,
                                                     ResidualAdd::kNone, true>;
        if constexpr (kPacks == kFullRowPacks<Math::kCentered>)
          if (n == int64_t(kPacks) * kWarpSize * kVec && (affine || !Math::kCentered))
            kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack,
                                                     ResidualAdd::kNone, Math::kCentered, /*kFullRow=*/true>;
        return launch_warp_rows(kernel, a.rows, stream, std::make_tuple(a), kRegisterRowsPerBlock);
      });
    if (a.residual && is_one_of(packs, StagedAddPacks<Math::kCentered>{}) &&
        packable<T>(n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias}))
      return with_exact_count(packs, StagedAddPacks<Math::kCentered>{}, [&](auto count) {
        constexpr int kPacks = decltype(count)::value;
        constexpr ParamLoads kLoads = !Math::kCentered && kPacks <= 3 ? ParamLoads::kPerPack : kParams;
        auto kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kLoads, ResidualAdd::kStaged>;
        if constexpr (Math::kCentered)
          if (a.weight && a.bias)
            kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kLoads, ResidualAdd::kStaged, true>;
        return launch_warp_rows(kernel, a.rows, stream, std::make_tuple(a), kRegisterRowsPerBlock,
                                staged_add_bytes<kPacks>(kRegisterRowsPerBlock));
      });
  }
  auto block_rows = [&] {
    if (const cudaError_t added = add_residual_first(a, stream); added != cudaSuccess) return added;
    return launch_block_rows(norm_forward_block_kernel<T, Math>, 1, sizeof(A), a.rows, n, stream,
                             std::make_tuple(a));
  };
  if (n > kWarpRowMax) {
    // Rows read twice. H200, bf16, µs, the row in registers -> read twice
    // (bench/micro/reread_rows.cu, several runs): rms_norm (8192, 16384)
    // 131.3-132.2 -> 126.6-127.7 (the copy 125.1-126.5), layer_norm
    // 131.6-133.2 -> 127.5-128.6; rms_norm without the keep hint (8192, 4104)
    // 41.2-41.4 -> 33.4-33.8, (8192, 5120) 45.2-46.0 -> 40.0, (8192, 6000)
    // 49.5-50.8 -> 46.7-47.3, (4096, 8192) 33.2-33.5 -> 32.0-32.3 (the
    // probe's times of a shape move by up to 2 µs with their order, the row
    // in registers among them: NOTES; bench/peers.py 32.3 -> 31.7). Narrower
    // layer_norm rows stay in registers: (4096, 8192) ties, and (8192, 6000),
    // (8192, 5120) and (8192, 4104) lose 1-6% to its three packs a thread.
    // Rows of 4096 tie. Eight two-byte packs a thread lose at every width
    // (float rows: kRereadRowMin's comment). float16 rms_norm, in registers
    // -> read twice: (8192, 4104) 39.1 -> 34.1, (8192, 16384) 131.0 ->
    // 127.2; (8192, 6000) 48.0 -> 47.6 and (4096, 8192) 33.4 -> 32.2 in one
    // run, 48.4 -> 49.6 and 33.5 -> 34.1 in another (ties within the probe's
    // order bias, as bf16's there: NOTES).
    if constexpr (kReadsTwice<T, Math>)
      if (!a.residual && n >= kRereadRowMin<T, Math> && n <= kRereadRowMax &&
          packable<T>(n, {a.x, a.y, a.weight, a.bias})) {
        constexpr bool kFloat = sizeof(T) == 4;
        constexpr int kWidePacks = kFloat ? 8 : 4;  // packs a thread past kRereadRowMax / 2
        const bool wide = n > kRereadRowMax / 2;
        const auto kernel = wide ? norm_forward_reread_kernel<T, kWidePacks, Math, true>
                                 : norm_forward_reread_kernel<T, 4, Math, kFloat>;
        kernel<<<a.rows, block_lane_threads(n / Vec16<T>::kSize, wide ? kWidePacks : 4), 0, stream>>>(a);
        return cudaGetLastError();
      }
    if constexpr (kReadsTwice<T, Math>)
      if (!a.residual && n >= kLooseRereadRowMin<T, Math> && n <= kRereadRowMax &&
          !packable<T>(n, {a.x, a.y, a.weight, a.bias}) && same_pack_offset({a.x, a.y})) {
        constexpr bool kFloat = sizeof(T) == 4;
        const bool eight = (kFloat && Math::kCentered) || n > kRereadRowMax / 2;
        const auto kernel = eight ? norm_forward_reread_kernel<T, 8, Math, true, true>
                                  : norm_forward_reread_kernel<T, 4, Math, kFloat, true>;
        kernel<<<a.rows, block_lane_threads(loose_row_packs<Vec16<T>::kSize>(n), eight ? 8 : 4), 0, stream>>>(a);
        return cudaGetLastError();
      }
    // Two-byte rows of 8192-16384 with the add, and float rows of 8192: read
    // twice too, h written by the first read with the keep hint and read
    // back from L2 by the second. H200, kernel µs, in registers (the
    // launcher) -> read twice (bench/micro/add_reread.cu, two runs): bf16
    // add_layer_norm (4096, 8192) 71.8-71.9 -> 66.0-66.3, (8192, 16384)
    // 298.4-300.1 -> 259.9-260.4, add_rms_norm 65.3-65.4 -> 65.0-65.2,
    // 283.7-284.6 -> 257.2-258.1; float32 (4096, 8192) add_layer_norm
    // 131.1-131.4 -> 130.1-130.4, add_rms_norm 130.7-131.4 -> 128.4-128.7.
    // (8192, 4096) and (4096, 6144) tied (bf16 add_rms_norm (8192, 4096)
    // 65.3-65.6 -> 64.3-64.7); without the hint, or with x and the residual
    // loaded streaming, 1-7% slower. float16, the launcher before -> after
    // (a launcher probe, NOTES): add_rms_norm (4096, 8192) 67.0-68.0 ->
    // 64.5-65.9, (8192, 16384) 286.7-289.5 -> 257.8-259.4, add_layer_norm
    // (4096, 8192) 70.4-71.4 -> 66.0-66.7.
    if constexpr (sizeof(T) <= 4)
      if (a.residual && n >= kRereadRowMax / 2 && n <= int64_t(4) * kRowThreadsMax * Vec16<T>::kSize &&
          packable<T>(n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias})) {
        norm_forward_reread_kernel<T, 4, Math, true, false, true>
            <<<a.rows, block_lane_threads(n / Vec16<T>::kSize), 0, stream>>>(a);
        return cudaGetLastError();
      }
    // Rows of 16385-32768 without a residual, two-byte ones and rms_norm's
    // float ones: one block a row of up to kWideRowThreads threads, 32
    // elements each, where the pipelined kernel below would split the row
    // over a cluster (whose exchange cost the time). H100, kernel µs in
    // bench/peers.py, clusters -> one block, (4096, 32768): bf16 rms_norm
    // 183.2 -> 175.7, layer_norm 193.1 -> 178.7 (the copy of their bytes
    // 173); float32 rms_norm 363.1 -> 354.8 (the copy 350). layer_norm's
    // float rows lose at eight packs (bench/micro/one_block_rows.cu: 366 ->
    // 442 at 32768, 343 -> 431 at 20000).
    if constexpr (sizeof(T) == 2 || (sizeof(T) == 4 && !Math::kCentered))
      if (const int threads = wide_row_threads<T>(n);
          threads && !a.residual && packable<T>(n, {a.x, a.y, a.weight, a.bias})) {
        constexpr int kVec = Vec16<T>::kSize, kPacks = kWideRowPacks<T>;
        const auto kernel =
            affine ? norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack,
                                               ResidualAdd::kNone, true, false, T, kWideRowThreads>
                   : norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack,
                                               ResidualAdd::kNone, false, false, T, kWideRowThreads>;
        kernel<<<a.rows, threads, 0, stream>>>(a);
        return cudaGetLastError();
      }
    // Walking clusters hold each thread's weight and bias packs in shared memory.
    const size_t weight_bytes = a.weight ? sizeof(Vec16<T>) : 0;
    const size_t bias_bytes = Math::kCentered && a.bias ? sizeof(Vec16<T>) : 0;
    // One-block rows that stage their weight (norm_kernels.cuh) get its packs' room.
    const size_t staged_bytes = kStagesWeight<T, Math> && a.weight ? sizeof(Vec16<T>) : 0;
    // The pipelined kernel's slots hold both parameters, given or not
    // (copy_to_walk_slots).
    const size_t pipelined_slot_bytes = kWalkSlotBytes<T, Vec16<T>::kSize, Math>;
    // Rows past one block without a residual (past 32768, or past 16384 and
    // not whole packs; layer_norm's float rows past 16384): the pipelined
    // kernel, in the blocks of launch_pipelined_rows (rows.h). H200, µs,
    // against the walks of the lanes kernel: bf16 rms_norm (512, 262144)
    // 155.8 -> 142.0, layer_norm 193.0 -> 164.7 (and (4096, 32768), before
    // the one-block rows above: 151.0 -> 136.6, 169.6 -> 147.4); float32
    // (1024, 65536) rms_norm 137.0 -> 134.6, layer_norm 150.1 -> 141.8.
    if constexpr (sizeof(T) <= 4) {
      const int64_t groups = a.residual ? 0 : pipelined_groups<T>(n, {a.x, a.y, a.weight, a.bias});
      if (const auto launched = launch_pipelined_rows<T, /*kWideAtEightPacks=*/false>(
              groups, a.rows, pipelined_slot_bytes, stream, std::make_tuple(a),
              [](auto packs) { return norm_forward_pipelined_kernel<T, decltype(packs)::value, Math>; }))
        return *launched;
    }
    if (!packable<T>(n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias}))
      if (const int threads = loose_row_threads<T>(n, {a.x, a.residual, a.residual_out, a.y})) {
        if (const cudaError_t added = add_residual_first(a, stream); added != cudaSuccess) return added;
        return launch_loose_rows<T>(loose_forward_for<T, Math, T>(every_param_given<Math>(a)), a.rows, n, threads,
                                    0, stream, std::make_tuple(a));
      }
    constexpr Walks kWalks = kPrefetchingWalk<T, 8> ? Walks::kPrefetching : Walks::kWhereResident;
    return launch_block_lanes<T, 8, kWalks>(
        a.rows, 0, n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias}, stream,
        [n, affine, residual = a.residual != nullptr](auto packs, auto vec, auto walk) {
          constexpr int kPacks = decltype(packs)::value, kVec = decltype(vec)::value;
          constexpr bool kWalk = decltype(walk)::value;
          // Two-byte rows of up to four packs a thread preload their
          // parameters; layer_norm's only in blocks of up to 128 threads
          // (its registers drop 512-thread blocks to one an SM: bf16 (8192,
          // 16384) 178 -> 235 µs; 256-thread ones to three). H100, bf16:
          // layer_norm (8192, 4096) 44.9 -> 43.8 µs, rms_norm (4096, 32768)
          // 186.5 -> 181.0 (NOTES.md).
          // layer_norm's element-wise rows past 1024 take 512 threads.
          constexpr bool kMayPreload = sizeof(T) == 2 && kPacks <= 4 && !kWalk;
          if constexpr (kMayPreload && !Math::kCentered) {
            // Except rms_norm's one-row blocks of 512 threads of 16-byte
            // packs, whose staged weight is as near without it (H200, bf16
            // (8192, 16384): 135.8 preloaded, 131.4 not; at 256 threads and
            // fewer preloading ties or wins: bench/micro/norm_row_variants.cu).
            if (kVec == Vec16<T>::kSize && block_lane_threads(n / kVec) == kRowThreadsMax)
              return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false>;
            return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>;
          } else {
            // One-row blocks compiled for given parameters: layer_norm's
            // two-byte ones (49 -> 40 registers at four packs; H200, bf16, µs:
            // (8192, 4096) 35.7 -> 35.2, (4096, 8192) 36.6 -> 35.6, (8192,
            // 16384) 138.8 -> 133.4, bench/micro/affine_rows.cu) and rms_norm's
            // float ones (40 -> 32 registers; float32 (8192, 1600) 26.4-26.5 ->
            // 26.0, (8192, 4096) 65.6-66.0 -> 64.8-64.9, (4096, 8192) 65.7 both,
            // bench/micro/float_rows.cu). layer_norm's float ones lost 1-3%.
            constexpr bool kCompiledAffine = kHalfType ? Math::kCentered : std::is_same_v<T, float> && !Math::kCentered;
            if constexpr (kCompiledAffine && !kWalk && kVec == Vec16<T>::kSize)
              if (affine)
                return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack,
                                                 ResidualAdd::kNone, /*kAffine=*/true>;
            // rms_norm's float rows with the add, blocks of up to 256
            // threads: the weight loaded after the reduction, not at each
            // store (H100, add_rms_norm float32, µs, bench/micro/param_loads.cu:
            // (8192, 1600) 69.9 -> 68.6, (8192, 4096) 179.7 -> 177.3; 512
            // threads lose, (4096, 8192) 176.4 -> 178.0. bench/peers.py's
            // kernel times, two builds alternating twice: 67.3, 67.5 ->
            // 65.9, 66.9 and 176.8, 176.7 -> 175.1, 175.5).
            if constexpr (std::is_same_v<T, float> && !Math::kCentered && !kWalk && kPacks <= 4 &&
                          kVec == Vec16<T>::kSize)
              if (residual && block_lane_threads(n / kVec) <= 256)
                return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>;
            if constexpr (kMayPreload && kVec > 1) {
              const int threads = block_lane_threads(n / kVec);
              if (threads != 0 && threads <= 128)
                return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>;
            }
            return norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, kWalk>;
          }
        },
        std::make_tuple(a), block_rows, (weight_bytes + bias_bytes) * kRowThreadsMax, staged_bytes);
  }
  // Float rows in registers, and two-byte rows with the residual add not
  // staged above (the staged kernel below cannot fuse it; those without it:
  // above). Double rows would not fit in registers.
  if (std::is_same_v<T, float> || (kHalfType && a.residual))
    return with_lanes<T>(n, {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias}, [&](auto per_lane, auto vec) {
      constexpr int kVec = decltype(vec)::value, kPacks = decltype(per_lane)::value / kVec;
      auto kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kParams>;
      // layer_norm's float rows of 16-byte packs with both parameters and no
      // residual: compiled knowing so (the add's code out too). H200,
      // float32, µs: (8192, 768) 15.1-15.2 -> 14.8-14.9, (32768, 1024)
      // 66.1-66.3 -> 65.5-65.6; rms_norm's ran 1% faster to 2% slower
      // (bench/micro/float_rows.cu).
      if constexpr (std::is_same_v<T, float> && Math::kCentered && kVec == Vec16<T>::kSize)
        if (affine)
          kernel = norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kParams, ResidualAdd::kNone, true>;
      return launch_warp_rows(kernel, a.rows, stream, std::make_tuple(a), kRegisterRowsPerBlock);
    });
  // Other two-byte rows (unaligned, or two packs a lane: 257-512) and double rows:
  // staged in shared memory, which keeps more bytes in flight than registers.
  if (const cudaError_t added = add_residual_first(a, stream); added != cudaSuccess) return added;
  return with_vec<T>(n, {a.x, a.y, a.weight, a.bias}, [&](auto vec) {
    return launch_staged_rows(norm_forward_staged_kernel<T, decltype(vec)::value, Math>, a.rows, n, sizeof(T),
                              stream, std::make_tuple(a));
  });
}

// float32 parameters beside two-byte rows: rows in registers, each
// parameter pack loaded where it applies (a warp a row up to kWarpRowMax, a
// block or a cluster a row past it), or one block a row where registers do
// not hold the row (the residual added in a pass first). Not the tuned
// variants of forward_rows: those hold the parameters as packs of T.
template <typename T, typename Math>
cudaError_t forward_rows_float_params(NormForwardArgs<T, float> a, cudaStream_t stream) {
  using P = float;
  const int64_t n = a.n;
  const std::initializer_list<const void*> buffers = {a.x, a.residual, a.residual_out, a.y, a.weight, a.bias};
  if (forward_takes_short_rows(a)) return short_rows_forward<T, Math>(a, stream);
  if (n <= kWarpRowMax)
    return with_lanes<T>(n, buffers, [&](auto per_lane, auto vec) {
      constexpr int kVec = decltype(vec)::value, kPacks = decltype(per_lane)::value / kVec;
      return launch_warp_rows(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack,
                                                        ResidualAdd::kInRegisters, false, false, P>,
                              a.rows, stream, std::make_tuple(a), kRegisterRowsPerBlock);
    });
  if (!packable<T>(n, buffers))
    if (const int threads = loose_row_threads<T>(n, {a.x, a.residual, a.residual_out, a.y})) {
      if (const cudaError_t added = add_residual_first(a, stream); added != cudaSuccess) return added;
      return launch_loose_rows<T>(loose_forward_for<T, Math, P>(every_param_given<Math>(a)), a.rows, n, threads, 0,
                                  stream, std::make_tuple(a));
    }
  return launch_block_lanes<T, 8>(
      a.rows, 0, n, buffers, stream,
      [](auto packs, auto vec) {
        return norm_forward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false, Math, false,
                                         ParamLoads::kPerPack, ResidualAdd::kInRegisters, false, false, P>;
      },
      std::make_tuple(a), [&] {
        if (const cudaError_t added = add_residual_first(a, stream); added != cudaSuccess) return added;
        return launch_block_rows(norm_forward_block_kernel<T, Math, P>, 1, sizeof(opmath_t<T>), a.rows, n, stream,
                                 std::make_tuple(a));
      });
}

// The shared memory a block of the two-byte lanes kernels stages its rows'
// residual gradient in (a row a warp, or one row a block), in 16-byte packs.
// H200, bf16, backward µs read at the store -> staged
// (bench/micro/norm_backward.cu): add_rms_norm (8192, 768) 23.0 -> 20.1,
// (8192, 1600) 48.2 -> 39.4; add_layer_norm 25.2 -> 22.5, 55.4 -> 46.6;
// forward + backward in bench/peers.py: add_rms_norm (32768, 1024) 153.6 ->
// 139.0, (4096, 8192) 168.2 -> 153.2; add_layer_norm 162.6 -> 146.6, 182.0
// -> 166.2. Rows split over clusters read it at the store still.
template <typename T>
size_t residual_stage_bytes(int64_t n, int vec, bool residual) {
  if (!kStagesResidual<T, Vec16<T>::kSize> || vec != Vec16<T>::kSize || !residual) return 0;
  if (n <= kWarpRowMax) return kWarpRowsPerBlock * n * sizeof(T);
  return block_lane_threads(n / vec) != 0 ? n * sizeof(T) : 0;
}

// The lanes backward, staging its residual gradient where the launch gives it
// room (`staged`: residual_stage_bytes is not 0).
template <typename T, int kPacks, int kVec, bool kWarpRows, typename Math, typename P>
auto backward_lanes_kernel(bool staged) {
  if constexpr (kStagesResidual<T, kVec>)
    if (staged) return norm_backward_lanes_kernel<T, kPacks, kVec, kWarpRows, Math, true, P>;
  return norm_backward_lanes_kernel<T, kPacks, kVec, kWarpRows, Math, false, P>;
}

// P: the parameters' type (T, or float beside two-byte rows).
template <typename T, typename Math, typename P>
cudaError_t backward_rows(NormBackwardArgs<T, P> a, ParamGrad dweight, ParamGrad dbias, void* workspace, int sm_count,
                          cudaStream_t stream) {
  using A = opmath_t<T>;
  const int64_t rows = a.rows, n = a.n;
  const std::initializer_list<const void*> buffers = {a.x, a.dy, a.dx, a.weight, a.grad_residual};
  const int vec = packable<T>(n, buffers) ? Vec16<T>::kSize : 1;
  const size_t residual_stage = residual_stage_bytes<T>(n, vec, a.grad_residual != nullptr);
  const int loose_threads = vec == 1 ? loose_row_threads<T>(n, {a.x, a.dy, a.dx, a.grad_residual}) : 0;
  const bool bias = dbias.data != nullptr;
  ParamGradPlan plan = loose_threads
                           ? loose_param_grad_plan<T>(rows, n, loose_threads, bias, sizeof(P), sm_count)
                           : param_grad_plan(rows, n, sizeof(A), vec, kBackwardMaxPacks<T>, sm_count, residual_stage);
  const bool params = dweight.data != nullptr;
  if (params && plan.fused && plan.cluster) {
    // As many chunks as clusters fit at once (fewer than one per SM share
    // where a GPC's SMs do not divide by the cluster): a second wave of a
    // few would double the time.
    auto resident_of = [&](auto packs) {
      constexpr int kPacks = decltype(packs)::value;
      return resident_clusters(norm_backward_lanes_kernel<T, kPacks, Vec16<T>::kSize, false, Math, false, P>,
                               plan.cluster, kRowThreadsMax, plan.shared_bytes);
    };
    int resident = 0;
    if (plan.packs == 4) resident = resident_of(std::integral_constant<int, 4>{});
    if constexpr (kBackwardMaxPacks<T> >= 8)
      if (plan.packs == 8) resident = resident_of(std::integral_constant<int, 8>{});
    if (resident > 0 && resident < plan.chunks) {
      plan.rows_per_chunk = ceil_div(rows, int64_t(resident));
      plan.chunks = ceil_div(rows, plan.rows_per_chunk);
    }
  }
  auto* bytes_base = static_cast<unsigned char*>(workspace);
  A* const partial_w = params ? reinterpret_cast<A*>(bytes_base) : nullptr;
  A* const partial_b = dbias.data ? reinterpret_cast<A*>(bytes_base + plan.partial_bytes) : nullptr;

  const bool fused = params && plan.fused;
  const size_t shared = fused ? plan.shared_bytes : residual_stage;
  NormBackwardArgs<T, P> lanes = a;
  lanes.partial_w = fused ? partial_w : nullptr;
  lanes.partial_b = fused ? partial_b : nullptr;
  lanes.rows_per_group = fused ? plan.rows_per_chunk : 1;  // unfused: a row per warp or block
  lanes.prefetch = fused && plan.prefetch;
  auto launch = [&](auto kernel, int64_t blocks, int threads) {
    if (const cudaError_t set = allow_shared_bytes(kernel, shared); set != cudaSuccess) return set;
    kernel<<<blocks, threads, shared, stream>>>(lanes);
    return cudaGetLastError();
  };
  auto block_rows = [&] {
    return launch_block_rows(norm_backward_block_kernel<T, Math, P>, 2, sizeof(A), rows, n, stream,
                             std::make_tuple(a));
  };
  cudaError_t err = cudaSuccess;
  if (takes_short_rows<T>(n, buffers) && (!params || plan.fused)) {
    // Several rows a warp: with the parameter gradients a block a chunk of
    // the plan's, else a block a tile of rows (not compiled for double rows,
    // which takes_short_rows never gives).
    if constexpr (sizeof(T) <= 4)
      err = with_short_row_lanes<T>(n, [&](auto lanes_per_row) {
        constexpr int kLanes = decltype(lanes_per_row)::value;
        NormBackwardArgs<T, P> shorts = lanes;
        const int64_t blocks = params ? plan.chunks : ceil_div(rows, kShortRowsPerBlock<kLanes>);
        shorts.rows_per_group = ceil_div(rows, blocks);
        norm_backward_short_rows_kernel<T, kLanes, Math, P>
            <<<blocks, kWarpRowsPerBlock * kWarpSize, 0, stream>>>(shorts);
        return cudaGetLastError();
      });
  } else if (n <= kWarpRowMax) {
    err = with_lanes<T>(n, buffers, [&](auto per_lane, auto vec) {
      constexpr int kVec = decltype(vec)::value, kPacks = decltype(per_lane)::value / kVec;
      return launch(backward_lanes_kernel<T, kPacks, kVec, true, Math, P>(residual_stage != 0),
                    fused ? plan.chunks : warp_row_blocks(rows), kWarpRowThreads);
    });
  } else if (loose_threads) {
    err = launch_loose_rows<T>(
        [](auto packs) { return norm_backward_loose_kernel<T, decltype(packs)::value, Math, P>; },
        fused ? plan.chunks : rows, n, loose_threads, shared, stream, std::make_tuple(lanes));
  } else {
    // Rows past one block run in clusters: a cluster per row, or per
    // chunk of rows when fused.
    err = launch_block_lanes<T, kBackwardMaxPacks<T>>(
        fused ? plan.chunks : rows, shared, n, buffers, stream,
        [staged = residual_stage != 0](auto packs, auto vec) {
          return backward_lanes_kernel<T, decltype(packs)::value, decltype(vec)::value, false, Math, P>(staged);
        },
        std::make_tuple(lanes), block_rows);
  }
  if (err != cudaSuccess || !params) return err;

  if (!plan.fused) {
    NormBackwardArgs<T, P> sums = a;
    sums.partial_w = partial_w;
    sums.partial_b = partial_b;
    norm_backward_params_kernel<T, Math, P>
        <<<dim3(ceil_div(n, kGradTile), plan.chunks), kGradTile * kGradLanes, 0, stream>>>(sums, plan.rows_per_chunk);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  auto fold = [&](auto group) {
    constexpr int kVec = decltype(group)::value;
    const dim3 blocks(static_cast<unsigned>(ceil_div(n / kVec, kFoldColumns)), partial_b ? 2 : 1);
    return launch_kernel(fold_param_grads_kernel<T, kVec, A>, blocks, kFoldThreads, 0, stream, After::Producer,
                         partial_w, partial_b, static_cast<int>(plan.chunks), n, dweight, dbias);
  };
  // 16-byte groups where n allows (each partial row then starts 16-byte aligned; the buffer does).
  if (n % (16 / sizeof(A)) != 0) return fold(std::integral_constant<int, 1>{});
  return fold(std::integral_constant<int, 16 / sizeof(A)>{});
}

}  // namespace

cudaError_t norm_forward(const NormShape& shape, const NormForwardBuffers<>& io, double eps, cudaStream_t stream) {
  if (shape.rows == 0) return cudaSuccess;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    return with_norm_math(shape.kind, [&](auto math) {
      using Math = decltype(math);
      return with_param_type<T>(shape, [&](auto param) {
        using P = typename decltype(param)::type;
        const NormForwardArgs<T, P> a{typed<T, A, P>(io), shape.rows, shape.n, static_cast<A>(eps)};
        if constexpr (std::is_same_v<P, T>) return forward_rows<T, Math>(a, stream);
        else return forward_rows_float_params<T, Math>(a, stream);
      });
    });
  });
}

// A grid-stride pass: one wave of blocks, 16-byte packs where the buffers allow.
constexpr int kNormalizeThreads = 256, kNormalizeBlocksPerSm = 8;

cudaError_t normalize_rows(const NormShape& shape, const NormApplyBuffers<>& io, int sm_count, cudaStream_t stream) {
  if (shape.rows * shape.n == 0) return cudaSuccess;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    auto launch = [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const int64_t packs = shape.rows * shape.n / kVec;
      const int64_t blocks =
          std::min<int64_t>(ceil_div(packs, kNormalizeThreads), int64_t(sm_count) * kNormalizeBlocksPerSm);
      return with_param_type<T>(shape, [&](auto param) {
        using P = typename decltype(param)::type;
        const NormalizeArgs<T, P> a{typed<T, A, P>(io), shape.rows, shape.n};
        normalize_rows_kernel<T, kVec, P><<<blocks, kNormalizeThreads, 0, stream>>>(a);
        return cudaGetLastError();
      });
    };
    if (packable<T>(shape.n, {io.x, io.weight, io.bias, io.y}))
      return launch(std::integral_constant<int, Vec16<T>::kSize>{});
    return launch(std::integral_constant<int, 1>{});
  });
}

// Enough for either plan: whether the rows are packable is known at launch.
// One partial buffer for each parameter gradient asked for.
size_t norm_backward_workspace_bytes(const NormShape& shape, const NormParamGrads& grads, int sm_count) {
  if (!grads.dweight) return 0;
  const size_t buffers = grads.dbias ? 2 : 1;
  size_t bytes = 0;
  dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (const int vec : {1, Vec16<T>::kSize}) {
      const auto plan =
          param_grad_plan(shape.rows, shape.n, sizeof(opmath_t<T>), vec, kBackwardMaxPacks<T>, sm_count);
      bytes = std::max(bytes, buffers * plan.partial_bytes);
    }
    // Loose rows take no more partial rows than packed ones, or the separate pass's.
    const auto separate = separate_pass_plan(shape.rows, shape.n, sizeof(opmath_t<T>), sm_count);
    bytes = std::max(bytes, buffers * separate.partial_bytes);
    return cudaSuccess;
  });
  return bytes;
}

cudaError_t norm_backward(const NormShape& shape, const NormBackwardBuffers<>& io, const NormParamGrads& grads,
                          void* workspace, int sm_count, cudaStream_t stream) {
  if (shape.rows == 0 || shape.n == 0) return cudaSuccess;
  return dispatch_floating(shape.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = opmath_t<T>;
    // T's own accumulator type needs no narrowing.
    constexpr bool kNarrower = sizeof(T) < sizeof(A);
    const ParamGrad dweight{grads.dweight, kNarrower && grads.dweight_in_input_type};
    const ParamGrad dbias{grads.dbias, kNarrower && grads.dbias_in_input_type};
    return with_norm_math(shape.kind, [&](auto math) {
      return with_param_type<T>(shape, [&](auto param) {
        using P = typename decltype(param)::type;
        const NormBackwardArgs<T, P> a{typed<T, A, P>(io), nullptr, nullptr, shape.rows, shape.n, 1, false};
        return backward_rows<T, decltype(math), P>(a, dweight, dbias, workspace, sm_count, stream);
      });
    });
  });
}

}  // namespace fastreduce
