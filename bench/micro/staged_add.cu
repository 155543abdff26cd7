// The fused add's two-byte warp rows with the residual staged in shared
// memory (ResidualAdd::kStaged: copied with cp.async while the row loads,
// added pack by pack, so that only the row's packs wait in registers)
// against the residual's packs in registers beside the row's (what the
// launcher ran up to 1024 wide), at 512-1792 wide, where bench/peers.py
// finds add_layer_norm and add_rms_norm bf16 forwards behind a peer. Prints
// µs, registers, blocks an SM, the copy of the same bytes, the launcher's time
// (one-row blocks past 1024) and the largest |y| difference from its output.
// bash bench/micro/run.sh staged_add
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using T = __nv_bfloat16;

template <typename Math, int kPacks>
void run(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/true);
  const int warps = 4;
  auto time_kernel = [&](auto kernel, size_t shared, const char* what) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * kWarpSize, shared));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    CHECK(cudaMemset(c.args.y, 0, c.buffers.bytes()));
    const float us =
        timer.median_us([&] { kernel<<<ceil_div(rows, int64_t(warps)), warps * kWarpSize, shared>>>(c.args); });
    std::printf("| %s | (%lld, %lld) | %d | %s | %d regs, %d an SM | %.1f | %.1f | %.1f | %.3f | %.3g |\n", c.name,
                (long long)rows, (long long)n, kPacks, what, attributes.numRegs, per_sm, c.copy_us, c.launcher_us,
                us, c.launcher_us / us, c.difference());
  };
  // The launcher's parameter loads for warp rows with the add.
  constexpr ParamLoads kParams = Math::kCentered ? ParamLoads::kAhead : ParamLoads::kWithRow;
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kParams, ResidualAdd::kInRegisters>, 0,
              "in registers");
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kParams, ResidualAdd::kStaged>,
              staged_add_bytes<kPacks>(warps), "staged");
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack, ResidualAdd::kStaged>,
              staged_add_bytes<kPacks>(warps), "staged, per pack");
  if constexpr (Math::kCentered) {
    time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kParams, ResidualAdd::kStaged, true>,
                staged_add_bytes<kPacks>(warps), "staged, affine");
    time_kernel(
        norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack, ResidualAdd::kStaged, true>,
        staged_add_bytes<kPacks>(warps), "staged, per pack, affine");
  }
}

template <int kPacks>
void both_norms(Timer& timer, int64_t rows, int64_t n) {
  run<LayerNormMath, kPacks>(timer, rows, n);
  run<RmsNormMath, kPacks>(timer, rows, n);
}

int main() {
  Timer timer;
  std::printf(
      "| norm | shape | packs | residual | registers | copy µs | launcher µs | kernel µs | launcher / kernel | max "
      "|y diff| |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    both_norms<2>(timer, 8192, 512);
    both_norms<3>(timer, 8192, 768);
    both_norms<4>(timer, 32768, 1024);
    both_norms<5>(timer, 16384, 1280);
    both_norms<6>(timer, 8192, 1536);
    both_norms<7>(timer, 8192, 1600);
    both_norms<7>(timer, 4096, 1792);
  }
  return 0;
}
