// When the norm forward's register kernels load their weight and bias packs,
// at the shapes where bench/peers.py finds the forward behind a peer. Each
// pack's parameters loaded just before its store (kPerPack) wait behind the
// store before it, pack after pack; kAhead loads pack p + 1's before pack
// p's store; kBeforeOutput (block rows) all of them after the reduction;
// kWithRow (warp rows) all of them with the row. Times each against the
// launcher, at the launcher's block size, in alternating rounds, and prints
// µs, registers, blocks an SM, the copy of the same bytes, and the largest
// |y| difference from the launcher's output. bash bench/micro/run.sh param_loads
#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

// The launcher and each variant are timed in kRounds rounds, each round
// starting one later in the list, and each reported as the median of its
// rounds: a probe's times of a shape move by up to 2 µs with their order.
constexpr int kRounds = 5;

template <typename T, typename Math, int kPacks, bool kWarpRows>
void run(Timer& timer, int64_t rows, int64_t n, bool fused_add) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, fused_add);
  NormForwardArgs<T>& a = c.args;
  // Warp rows in the launcher's blocks of four; block rows of the fewest
  // threads holding four packs each, rms_norm's two-byte ones with room to
  // stage their weight.
  const int threads = kWarpRows ? 4 * kWarpSize : rows::block_lane_threads(n / kVec);
  const int64_t grid = kWarpRows ? ceil_div(rows, int64_t(4)) : rows;
  const size_t shared = !kWarpRows && kStagesWeight<T, Math> ? size_t(kPacks) * threads * 16 : 0;
  struct Timed {
    const char* what;
    std::function<void()> launch;
    std::string kernel;  // registers and blocks an SM; empty for the launcher
    float difference;    // the largest |y| difference from the launcher's output
    std::vector<float> us;
  };
  std::vector<Timed> timed;
  timed.push_back({"launcher", [&] { c.launch(); }, "", 0.0f, {}});
  // add_compiled: the add's code compiled in without a residual given.
  auto variant = [&](auto loads, const char* what, bool add_compiled = false) {
    constexpr ParamLoads kLoads = decltype(loads)::value;
    const auto kernel =
        fused_add || add_compiled
            ? norm_forward_lanes_kernel<T, kPacks, kVec, kWarpRows, Math, false, kLoads, ResidualAdd::kInRegisters>
            : norm_forward_lanes_kernel<T, kPacks, kVec, kWarpRows, Math, false, kLoads, ResidualAdd::kNone>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    CHECK(cudaMemset(a.y, 0, c.buffers.bytes()));
    kernel<<<grid, threads, shared>>>(a);  // its y for the difference (read back after it ends)
    CHECK(cudaGetLastError());
    timed.push_back({what, [=, &a] { kernel<<<grid, threads, shared>>>(a); },
                     std::to_string(attributes.numRegs) + " regs, " + std::to_string(per_sm) + " an SM",
                     c.difference(), {}});
  };
  using Loads = ParamLoads;
  variant(std::integral_constant<Loads, Loads::kPerPack>{}, "per pack");
  variant(std::integral_constant<Loads, Loads::kAhead>{}, "ahead");
  if constexpr (kWarpRows) {
    variant(std::integral_constant<Loads, Loads::kWithRow>{}, "with row");
    // short_rows.cu's fixed order timed this one 0.6-1.7 µs under the add
    // compiled out, at every two-byte width (H100).
    if (!fused_add) variant(std::integral_constant<Loads, Loads::kWithRow>{}, "with row, add compiled", true);
  }
  else variant(std::integral_constant<Loads, Loads::kBeforeOutput>{}, "before output");
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < timed.size(); ++i) {
      Timed& t = timed[(i + round) % timed.size()];
      t.us.push_back(timer.median_us(t.launch));
    }
  const auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const float launcher_us = median(timed[0].us);
  for (const Timed& t : timed)
    std::printf("| %s | %s | (%lld, %lld) | %s %d x %d | %s | %s | %.1f | %.1f | %.1f | %.3f | %.3g |\n", c.name,
                c.dtype, (long long)rows, (long long)n, kWarpRows ? "warp" : "block", threads, kPacks, t.what,
                t.kernel.c_str(), c.copy_us, launcher_us, median(t.us), launcher_us / median(t.us), t.difference);
}

template <typename T, int kPacks, bool kWarpRows>
void both_norms(Timer& timer, int64_t rows, int64_t n, bool fused_add) {
  run<T, LayerNormMath, kPacks, kWarpRows>(timer, rows, n, fused_add);
  run<T, RmsNormMath, kPacks, kWarpRows>(timer, rows, n, fused_add);
}

int main() {
  Timer timer;
  std::printf(
      "| norm | dtype | shape | rows: threads x packs | parameters | kernel | copy µs | launcher µs | kernel µs | "
      "launcher / kernel | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  using bf16 = __nv_bfloat16;
  for (bool add : {false, true}) {
    both_norms<bf16, 3, true>(timer, 8192, 768, add);
    both_norms<bf16, 4, true>(timer, 32768, 1024, add);
    both_norms<bf16, 7, true>(timer, 8192, 1600, add);
    both_norms<bf16, 4, false>(timer, 8192, 1600, add);  // 64 threads for 200 packs
    both_norms<bf16, 4, false>(timer, 8192, 4096, add);
    both_norms<bf16, 4, false>(timer, 4096, 8192, add);
    both_norms<bf16, 4, false>(timer, 8192, 16384, add);
    both_norms<float, 6, true>(timer, 8192, 768, add);
    both_norms<float, 8, true>(timer, 32768, 1024, add);
    both_norms<float, 4, false>(timer, 8192, 1600, add);  // 128 threads for 400 packs
    both_norms<float, 4, false>(timer, 8192, 4096, add);
    both_norms<float, 4, false>(timer, 4096, 8192, add);
    // The bytes of (8192, 768) in half the warp rows, twice as long.
    both_norms<bf16, 6, true>(timer, 4096, 1536, add);
    both_norms<float, 12, true>(timer, 4096, 1536, add);
  }
  return 0;
}
