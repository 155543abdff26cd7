// Warp-row norm forwards compiled for rows of exactly kPacks packs a lane
// (kFullRow: no pack guarded, so no branch or reconvergence around each
// pack's loads, sums and stores) against the same kernel guarded, which the
// launcher ran for every such row before kFullRowPacks (norms.cu), at the
// widths that are whole warp-wide packs (bf16 512-1792, float32 768). Prints
// µs, registers, the copy of the same bytes, the launcher's time and the
// largest |y| difference from its output.
// bash bench/micro/run.sh full_rows
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using bf16 = __nv_bfloat16;
constexpr ParamLoads kPerPack = ParamLoads::kPerPack, kAhead = ParamLoads::kAhead, kWithRow = ParamLoads::kWithRow;
constexpr ResidualAdd kNoAdd = ResidualAdd::kNone, kAdd = ResidualAdd::kInRegisters, kStaged = ResidualAdd::kStaged;
constexpr int kWarps = 4;

// Times `guarded` (every pack guarded) and `full` (its kFullRow twin)
// on one case; `shared`: the staged residual's bytes, where it is staged.
template <typename T, typename Math, typename Kernel>
void run(Timer& timer, int64_t rows, int64_t n, bool fused_add, int packs, Kernel guarded, Kernel full,
         size_t shared = 0) {
  ForwardCase<T, Math> c(timer, rows, n, fused_add);
  const auto time_kernel = [&](Kernel kernel, const char* what) {
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    CHECK(cudaMemset(c.args.y, 0, c.buffers.bytes()));
    const float us = timer.median_us(
        [&] { kernel<<<ceil_div(rows, int64_t(kWarps)), kWarps * kWarpSize, shared>>>(c.args); });
    std::printf("| %s | %s | (%lld, %lld) | %d | %s | %d | %.1f | %.1f | %.1f | %.3f | %.3g |\n", c.name, c.dtype,
                (long long)rows, (long long)n, packs, what, attributes.numRegs, c.copy_us, c.launcher_us, us,
                c.launcher_us / us, c.difference());
  };
  time_kernel(guarded, "guarded");
  time_kernel(full, "full row");
}

// A warp-row forward kernel (norm_forward_lanes_kernel<..., kWarpRows = true>)
// of 16-byte packs.
template <typename T, int kPacks, typename Math, ParamLoads kParams, ResidualAdd kResidual, bool kAffine = false,
          bool kFullRow = false>
constexpr void (*warp_rows)(NormForwardArgs<T>) =
    norm_forward_lanes_kernel<T, kPacks, Vec16<T>::kSize, true, Math, false, kParams, kResidual, kAffine, kFullRow>;

// The guarded kernels norms.cu's forward_rows runs for two-byte warp rows.
template <int kPacks>
void bf16_rows(Timer& timer, int64_t rows) {
  const int64_t n = int64_t(kPacks) * kWarpSize * Vec16<bf16>::kSize;
  using LN = LayerNormMath;
  using RMS = RmsNormMath;
  if constexpr (kPacks >= 3) {
    run<bf16, LN>(timer, rows, n, false, kPacks, warp_rows<bf16, kPacks, LN, kPerPack, kNoAdd, true>,
                  warp_rows<bf16, kPacks, LN, kPerPack, kNoAdd, true, true>);
    run<bf16, RMS>(timer, rows, n, false, kPacks, warp_rows<bf16, kPacks, RMS, kPerPack, kNoAdd>,
                   warp_rows<bf16, kPacks, RMS, kPerPack, kNoAdd, false, true>);
  }
  if constexpr (kPacks <= 4) {
    run<bf16, LN>(timer, rows, n, true, kPacks, warp_rows<bf16, kPacks, LN, kAhead, kAdd>,
                  warp_rows<bf16, kPacks, LN, kAhead, kAdd, false, true>);
  } else {
    run<bf16, LN>(timer, rows, n, true, kPacks, warp_rows<bf16, kPacks, LN, kAhead, kStaged, true>,
                  warp_rows<bf16, kPacks, LN, kAhead, kStaged, true, true>, staged_add_bytes<kPacks>(kWarps));
  }
  constexpr ParamLoads kRmsLoads = kPacks <= 3 ? kPerPack : kWithRow;
  if constexpr (kPacks == 4) {
    run<bf16, RMS>(timer, rows, n, true, kPacks, warp_rows<bf16, kPacks, RMS, kWithRow, kAdd>,
                   warp_rows<bf16, kPacks, RMS, kWithRow, kAdd, false, true>);
  } else {
    run<bf16, RMS>(timer, rows, n, true, kPacks, warp_rows<bf16, kPacks, RMS, kRmsLoads, kStaged>,
                   warp_rows<bf16, kPacks, RMS, kRmsLoads, kStaged, false, true>, staged_add_bytes<kPacks>(kWarps));
  }
}

// Float rows of 768: six packs a lane, parameters with the row.
void float_rows(Timer& timer, int64_t rows) {
  using LN = LayerNormMath;
  using RMS = RmsNormMath;
  run<float, LN>(timer, rows, 768, false, 6, warp_rows<float, 6, LN, kWithRow, kNoAdd, true>,
                 warp_rows<float, 6, LN, kWithRow, kNoAdd, true, true>);
  run<float, RMS>(timer, rows, 768, false, 6, warp_rows<float, 6, RMS, kWithRow, kAdd>,
                  warp_rows<float, 6, RMS, kWithRow, kAdd, false, true>);
  run<float, LN>(timer, rows, 768, true, 6, warp_rows<float, 6, LN, kWithRow, kAdd>,
                 warp_rows<float, 6, LN, kWithRow, kAdd, false, true>);
  run<float, RMS>(timer, rows, 768, true, 6, warp_rows<float, 6, RMS, kWithRow, kAdd>,
                  warp_rows<float, 6, RMS, kWithRow, kAdd, false, true>);
}

int main() {
  Timer timer;
  std::printf(
      "| norm | dtype | shape | packs | kernel | registers | copy µs | launcher µs | kernel µs | launcher / kernel | "
      "max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    bf16_rows<2>(timer, 8192);
    bf16_rows<3>(timer, 8192);
    bf16_rows<4>(timer, 32768);
    bf16_rows<6>(timer, 8192);
    bf16_rows<7>(timer, 4096);
    float_rows(timer, 8192);
  }
  return 0;
}
