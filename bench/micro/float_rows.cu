// float32 norm forwards without a residual, compiled with the add's code out
// (ResidualAdd::kNone) and for a given weight and bias (kAffine), as the
// two-byte rows are, against the launcher's kernels, which serve every
// combination: warp rows of 6 and 8 packs a lane (768, 1024 wide) and
// one-row blocks of four packs a thread (1600-8192). Prints µs, registers,
// blocks an SM, the copy of the same bytes and the largest |y| difference
// from the launcher's output, twice. bash bench/micro/run.sh float_rows
#include <initializer_list>
#include <utility>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using T = float;
using Kernel = void (*)(NormForwardArgs<T>);
constexpr int kVec = Vec16<T>::kSize;
constexpr ParamLoads kPerPack = ParamLoads::kPerPack, kWithRow = ParamLoads::kWithRow,
                     kBefore = ParamLoads::kBeforeOutput;
constexpr ResidualAdd kNoAdd = ResidualAdd::kNone;

template <typename Math>
void run(Timer& timer, int64_t rows, int64_t n, int threads, int64_t blocks,
         std::initializer_list<std::pair<const char*, Kernel>> kernels) {
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/false);
  for (const auto& variant : kernels) {
    const Kernel kernel = variant.second;
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    CHECK(cudaMemset(c.args.y, 0, c.buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<blocks, threads>>>(c.args); });
    std::printf("| %s | (%lld, %lld) | %s | %d regs, %d an SM | %.1f | %.1f | %.1f | %.2f | %.3g |\n", c.name,
                (long long)rows, (long long)n, variant.first, attributes.numRegs, per_sm, c.copy_us, c.launcher_us, us,
                c.copy_us / us, c.difference());
  }
}

template <typename Math, int kPacks>
void warp_rows(Timer& timer, int64_t rows, int64_t n) {
  run<Math>(timer, rows, n, 128, ceil_div(rows, int64_t(4)),
            {{"warp rows, the launcher's", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kWithRow>},
             {"warp rows, no add", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kWithRow, kNoAdd>},
             {"warp rows, no add, given",
              norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kWithRow, kNoAdd, true>},
             {"warp rows, per pack, no add, given",
              norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, kNoAdd, true>}});
}

template <typename Math>
void block_rows(Timer& timer, int64_t rows, int64_t n) {
  const int threads = rows::block_lane_threads(n / kVec);
  run<Math>(timer, rows, n, threads, rows,
            {{"block rows, the launcher's", norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack>},
             {"block rows, no add, given",
              norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack, kNoAdd, true>},
             {"block rows, before output, no add, given",
              norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kBefore, kNoAdd, true>}});
}

template <typename Math>
void widths(Timer& timer) {
  warp_rows<Math, 6>(timer, 8192, 768);
  warp_rows<Math, 8>(timer, 32768, 1024);
  block_rows<Math>(timer, 8192, 1600);
  block_rows<Math>(timer, 8192, 4096);
  block_rows<Math>(timer, 4096, 8192);
}

int main() {
  Timer timer;
  std::printf(
      "| norm | shape | kernel | registers | copy µs | launcher µs | kernel µs | of copy | max |y diff| "
      "|\n|---|---|---|---|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    widths<LayerNormMath>(timer);
    widths<RmsNormMath>(timer);
  }
  return 0;
}
