// layer_norm's two-byte forwards compiled for a given weight and bias
// (kAffine: no null checks or selects in the output pass) against the same
// kernels compiled for either being null: warp rows of 3-7 packs a lane
// (768-1792 wide) and one-row blocks of four packs a thread (4096-16384)
// without a residual, against what the launcher ran before kAffine; the
// fused add's warp rows (768, 1024) with their parameters loaded a pack
// ahead (the launcher's) or per pack. Prints µs, the copy of the same bytes
// and the largest |y| difference from the launcher's output, twice.
// bash bench/micro/run.sh affine_rows
#include <cuda_bf16.h>

#include <initializer_list>
#include <utility>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using T = __nv_bfloat16;
using Math = LayerNormMath;
using Kernel = void (*)(NormForwardArgs<T>);
constexpr int kVec = Vec16<T>::kSize;
constexpr ParamLoads kPerPack = ParamLoads::kPerPack, kAhead = ParamLoads::kAhead;
constexpr ResidualAdd kNoAdd = ResidualAdd::kNone, kAdd = ResidualAdd::kInRegisters;

void run(Timer& timer, int64_t rows, int64_t n, bool fused_add, int threads, int64_t blocks,
         std::initializer_list<std::pair<const char*, Kernel>> kernels) {
  ForwardCase<T, Math> c(timer, rows, n, fused_add);
  for (const auto& variant : kernels) {
    const Kernel kernel = variant.second;
    CHECK(cudaMemset(c.args.y, 0, c.buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<blocks, threads>>>(c.args); });
    std::printf("| %s | (%lld, %lld) | %s | %.1f | %.1f | %.1f | %.2f | %.3g |\n", c.name, (long long)rows,
                (long long)n, variant.first, c.copy_us, c.launcher_us, us, c.copy_us / us, c.difference());
  }
}

template <int kPacks>
void warp_rows(Timer& timer, int64_t rows, int64_t n) {
  run(timer, rows, n, false, 128, ceil_div(rows, int64_t(4)),
      {{"warp rows, either null", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, kNoAdd>},
       {"warp rows, both given",
        norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, kNoAdd, true>}});
}

template <int kPacks>
void fused_add_warp_rows(Timer& timer, int64_t rows, int64_t n) {
  run(timer, rows, n, true, 128, ceil_div(rows, int64_t(4)),
      {{"ahead, either null", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kAhead>},
       {"ahead, both given", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kAhead, kAdd, true>},
       {"per pack, both given", norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, kAdd, true>}});
}

void block_rows(Timer& timer, int64_t rows, int64_t n) {
  const int threads = rows::block_lane_threads(n / kVec);
  // What the launcher took before: parameters before the output pass in
  // blocks of up to 128 threads, per pack beyond, the add's code compiled in.
  const Kernel before = threads <= 128
                            ? norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, ParamLoads::kBeforeOutput>
                            : norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack>;
  run(timer, rows, n, false, threads, rows,
      {{"block rows, either null", before},
       {"block rows, both given", norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack, kNoAdd, true>}});
}

int main() {
  Timer timer;
  std::printf(
      "| norm | shape | kernel | copy µs | launcher µs | kernel µs | of copy | max |y diff| "
      "|\n|---|---|---|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    warp_rows<3>(timer, 8192, 768);
    warp_rows<4>(timer, 32768, 1024);
    warp_rows<5>(timer, 16384, 1280);
    warp_rows<6>(timer, 8192, 1536);
    warp_rows<7>(timer, 8192, 1600);
    block_rows(timer, 8192, 4096);
    block_rows(timer, 4096, 8192);
    block_rows(timer, 8192, 16384);
    fused_add_warp_rows<3>(timer, 8192, 768);
    fused_add_warp_rows<4>(timer, 32768, 1024);
  }
  return 0;
}
