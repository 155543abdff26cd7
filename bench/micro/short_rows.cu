// The norm forward of short rows (768-2048 wide, with and without the fused
// add), where torch.compile's persistent reduction (a row a one-warp program,
// the row in registers) beat the launcher's staged two-byte warp rows by 4-13%
// (bench/peers.py). Times the launcher against the register kernels: a row a
// block of `threads` threads holding kPacks packs each, with and without
// preloaded parameters, and a row a warp with its parameters loaded with the
// row or pack by pack, with and without the add's code (ResidualAdd::kNone),
// and, for bf16, a lean kernel of the probe's own and rows read as 4-byte
// words.
// Prints µs, the copy of the same bytes, and the largest |y| difference from
// the launcher's output. bash bench/micro/run.sh short_rows
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

// A lean row a warp for the comparison (bf16, 16-byte packs): the row's packs
// converted once into floats, mean and variance in two passes over the
// registers (as Inductor's persistent reduction), parameters loaded after the
// reduction. L2 hints (x evict_first and no L1 allocation, parameters
// evict_last) made it 12-20% slower on the H200.
// kParamsEarly: the parameters loaded with x instead; kShifted: the shifted
// one-pass variance (row_rstd) instead. (Converting x again in the output
// pass: no change.)
enum class Lean { kTwoPass, kParamsEarly, kShifted };
template <int kPacks, bool kCentered, bool kResidual, Lean kVariant = Lean::kTwoPass>
__global__ void __launch_bounds__(128) lean_rows(NormForwardArgs<__nv_bfloat16> a) {
  using T = __nv_bfloat16;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= a.rows) return;
  const int lane = threadIdx.x % kWarpSize, groups = int(a.n / 8);
  const int64_t offset = row * a.n;
  float v[kPacks][8];
  uint4 ws[kPacks], bs[kPacks];
  if constexpr (kVariant == Lean::kParamsEarly) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = p * kWarpSize + lane;
      ws[p] = g < groups ? *reinterpret_cast<const uint4*>(a.weight + g * 8) : uint4{};
      if constexpr (kCentered) bs[p] = g < groups ? *reinterpret_cast<const uint4*>(a.bias + g * 8) : uint4{};
    }
  }
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int g = p * kWarpSize + lane;
    uint4 w = g < groups ? *reinterpret_cast<const uint4*>(a.x + offset + g * 8) : uint4{};
    if constexpr (kResidual) {
      const uint4 r = g < groups ? *reinterpret_cast<const uint4*>(a.residual + offset + g * 8) : uint4{};
      uint4 h;
      uint32_t* hw = &h.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float lo = word_element<T>(w, 2 * j) + word_element<T>(r, 2 * j);
        const float hi = word_element<T>(w, 2 * j + 1) + word_element<T>(r, 2 * j + 1);
        const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        hw[j] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      if (g < groups) *reinterpret_cast<uint4*>(a.residual_out + offset + g * 8) = h;
      w = h;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) v[p][j] = word_element<T>(w, j);
  }
  float mean = 0, rstd;
  if constexpr (kVariant == Lean::kShifted) {
    rstd = row_rstd<kCentered>(
        a.n, a.eps, __shfl_sync(kFullMask, v[0][0], 0),
        [&](auto f) {
#pragma unroll
          for (int p = 0; p < kPacks; ++p)
            if (p * kWarpSize + lane < groups)
#pragma unroll
              for (int j = 0; j < 8; ++j) f(v[p][j]);
        },
        [](auto x) { return warp_allreduce<SumOp<decltype(x)>>(x); }, mean);
  } else {
    const float count = float(a.n);
    if constexpr (kCentered) {
      float sum = 0;
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
#pragma unroll
        for (int j = 0; j < 8; ++j) sum += v[p][j];
      mean = warp_allreduce<SumOp<float>>(sum) / count;
    }
    float squares = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const bool in_row = p * kWarpSize + lane < groups;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = v[p][j] - mean;
        squares += in_row ? d * d : 0.f;
      }
    }
    rstd = rsqrtf(warp_allreduce<SumOp<float>>(squares) / count + a.eps);
  }
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int g = p * kWarpSize + lane;
    if (g >= groups) continue;
    uint4 w = ws[p], b{};
    if constexpr (kVariant != Lean::kParamsEarly) {
      w = *reinterpret_cast<const uint4*>(a.weight + g * 8);
      if constexpr (kCentered) b = *reinterpret_cast<const uint4*>(a.bias + g * 8);
    } else if constexpr (kCentered) {
      b = bs[p];
    }
    uint4 out;
    uint32_t* ow = &out.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float y[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = 2 * j + k;
        y[k] = (v[p][e] - mean) * rstd * word_element<T>(w, e);
        if constexpr (kCentered) y[k] += word_element<T>(b, e);
      }
      const __nv_bfloat162 pair = __floats2bfloat162_rn(y[0], y[1]);
      ow[j] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(a.y + offset + g * 8) = out;
  }
  if (lane == 0) {
    if constexpr (kCentered) a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n, bool fused_add) {
  constexpr int kVec = Vec16<T>::kSize;
  const int groups = int(n / kVec);
  ForwardCase<T, Math> c(timer, rows, n, fused_add);
  NormForwardArgs<T>& a = c.args;
  auto time_kernel = [&](auto kernel, const char* what, int packs, int threads, int64_t grid) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    CHECK(cudaMemset(a.y, 0, c.buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<grid, threads>>>(a); });
    std::printf("| %s | %s | (%lld, %lld) | %s: %d x %d, %d regs, %d an SM | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n",
                c.name, c.dtype, (long long)rows, (long long)n, what, threads, packs, attributes.numRegs, per_sm,
                c.copy_us, c.launcher_us, us, c.copy_us / c.launcher_us, c.copy_us / us, c.difference());
  };
  // A row a block: the fewest whole warps that hold the row at kPacks a thread.
  auto block_rows = [&](auto packs) {
    constexpr int kPacks = decltype(packs)::value;
    const int threads = int(ceil_div(ceil_div(groups, kPacks), 32) * 32);
    if (threads > kRowThreadsMax || (kPacks > 1 && ceil_div(groups, threads) < kPacks)) return;
    time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack>, "row a block", kPacks, threads,
                rows);
    time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>, "row a block, preload", kPacks,
                threads, rows);
  };
  block_rows(std::integral_constant<int, 1>{});
  block_rows(std::integral_constant<int, 2>{});
  block_rows(std::integral_constant<int, 3>{});
  block_rows(std::integral_constant<int, 4>{});
  // A row a warp, in blocks of four warps (the launcher's) and of one, its
  // parameters loaded with the row (the launcher's) or pack by pack.
  auto warp_rows = [&](auto packs) {
    constexpr int kPacks = decltype(packs)::value;
    if (ceil_div(groups, kWarpSize) != kPacks) return;
    auto both = [&](auto kernel, const char* what) {
      time_kernel(kernel, what, kPacks, 4 * kWarpSize, ceil_div(rows, int64_t(4)));
      time_kernel(kernel, what, kPacks, kWarpSize, rows);
    };
    both(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kWithRow>, "row a warp, with row");
    both(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack>, "row a warp, per pack");
    if (!fused_add) {
      both(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kWithRow, ResidualAdd::kNone>,
           "row a warp, with row, no add");
      both(norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, ParamLoads::kPerPack, ResidualAdd::kNone>,
           "row a warp, per pack, no add");
    }
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (fused_add) {
        both(lean_rows<kPacks, Math::kCentered, true>, "lean warp");
      } else {
        both(lean_rows<kPacks, Math::kCentered, false>, "lean warp");
        both(lean_rows<kPacks, Math::kCentered, false, Lean::kParamsEarly>, "lean warp, parameters early");
        both(lean_rows<kPacks, Math::kCentered, false, Lean::kShifted>, "lean warp, shifted one pass");
      }
    }
  };
  // Two-byte rows read as 4-byte words, a row a warp of exactly kWords
  // words a lane (1600 is 6.25 16-byte packs a lane: its seventh pack idles
  // 24 of 32 lanes; as words every lane holds 25).
  auto word_rows = [&](auto words) {
    constexpr int kWords = decltype(words)::value;
    if (n != int64_t(kWords) * kWarpSize * 2) return;
    auto both = [&](auto kernel, const char* what) {
      time_kernel(kernel, what, kWords, 4 * kWarpSize, ceil_div(rows, int64_t(4)));
    };
    if (fused_add) {
      both(norm_forward_lanes_kernel<T, kWords, 2, true, Math, false, ParamLoads::kWithRow>, "words a warp, with row");
      both(norm_forward_lanes_kernel<T, kWords, 2, true, Math, false, ParamLoads::kPerPack>, "words a warp, per pack");
    } else {
      both(norm_forward_lanes_kernel<T, kWords, 2, true, Math, false, ParamLoads::kWithRow, ResidualAdd::kNone, true,
                                     true>,
           "words a warp, with row, affine, full");
      both(norm_forward_lanes_kernel<T, kWords, 2, true, Math, false, ParamLoads::kPerPack, ResidualAdd::kNone, true,
                                     true>,
           "words a warp, per pack, affine, full");
      both(norm_forward_lanes_kernel<T, kWords, 2, true, Math, false, ParamLoads::kAhead, ResidualAdd::kNone, true,
                                     true>,
           "words a warp, ahead, affine, full");
    }
  };
  if constexpr (sizeof(T) == 2) {
    word_rows(std::integral_constant<int, 12>{});
    word_rows(std::integral_constant<int, 25>{});
  }
  if constexpr (std::is_same_v<T, float>) {
    warp_rows(std::integral_constant<int, 6>{});
    warp_rows(std::integral_constant<int, 8>{});
  } else {
    warp_rows(std::integral_constant<int, 3>{});
    warp_rows(std::integral_constant<int, 4>{});
    warp_rows(std::integral_constant<int, 5>{});
    warp_rows(std::integral_constant<int, 7>{});
    warp_rows(std::integral_constant<int, 8>{});
  }
}

int main() {
  Timer timer;
  std::printf(
      "| norm | dtype | shape | kernel: threads x packs | copy µs | launcher µs | kernel µs | launcher of copy | kernel "
      "of copy | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 768}, {32768, 1024}, {16384, 1280}, {8192, 1600}, {8192, 2048}};
  for (bool fused_add : {false, true})
    for (auto [rows, n] : shapes) {
      run<__nv_bfloat16, LayerNormMath>(timer, rows, n, fused_add);
      run<__nv_bfloat16, RmsNormMath>(timer, rows, n, fused_add);
    }
  const std::pair<int64_t, int64_t> float_shapes[] = {{8192, 768}, {32768, 1024}};
  for (bool fused_add : {false, true})
    for (auto [rows, n] : float_shapes) {
      run<float, LayerNormMath>(timer, rows, n, fused_add);
      run<float, RmsNormMath>(timer, rows, n, fused_add);
    }
  return 0;
}
