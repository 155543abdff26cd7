// Two-byte warp rows (768-1792 wide, no residual) that walk: a grid of a few
// blocks an SM, each warp taking every stride-th row, with and without its
// next row's packs loaded while the current row reduces and stores. The
// launcher's warp rows take one row a warp and end, so a warp holds about
// two rows of (8192, 1600) in all and nothing loads during its reduction and
// output pass (layer_norm bf16 (8192, 1600) at 0.84-0.89 of the copy).
// Prints µs against the launcher and the copy of the same bytes, and the
// largest |y| difference from the launcher's output.
//   bash bench/micro/run.sh walk_rows
#include <cuda_bf16.h>

#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using rows::with_exact_count;
using T = __nv_bfloat16;

template <int kPacks>
__device__ __forceinline__ void load_row(const T* x, int lane, int groups, uint4 (&packs)[kPacks]) {
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int g = p * kWarpSize + lane;
    packs[p] = g < groups ? reinterpret_cast<const uint4*>(x)[g] : uint4{};
  }
}

// A warp walks rows warp, warp + stride, ...; with kPrefetch it issues the
// next row's loads before the current row's sums. The parameters loaded
// pack by pack.
template <int kPacks, bool kCentered, bool kPrefetch>
__global__ void __launch_bounds__(128) walk_rows(NormForwardArgs<T> a) {
  const int lane = threadIdx.x % kWarpSize, groups = int(a.n / 8);
  const int64_t stride = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  int64_t row = blockIdx.x * int64_t(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  uint4 next[kPacks];
  if (kPrefetch && row < a.rows) load_row(a.x + row * a.n, lane, groups, next);
  for (; row < a.rows; row += stride) {
    uint4 packs[kPacks];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) packs[p] = next[p];
      if (row + stride < a.rows) load_row(a.x + (row + stride) * a.n, lane, groups, next);
    } else {
      load_row(a.x + row * a.n, lane, groups, packs);
    }
    // row_rstd's one pass of sums shifted by the row's first value, without
    // its second pass for rows of wide spread (the probe's rows are uniform):
    // the packs stay words, with no floats held across passes.
    const float count = float(a.n);
    const float shift = kCentered ? __shfl_sync(kFullMask, word_element<T>(packs[0], 0), 0) : 0.f;
    float sum = 0, squares = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const bool in_row = p * kWarpSize + lane < groups;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = in_row ? word_element<T>(packs[p], j) - shift : 0.f;
        sum += d;
        squares += d * d;
      }
    }
    float mean = 0, variance;
    if constexpr (kCentered) {
      const float shifted_mean = warp_allreduce<SumOp<float>>(sum) / count;
      mean = shift + shifted_mean;
      variance = fmaxf(warp_allreduce<SumOp<float>>(squares) / count - shifted_mean * shifted_mean, 0.f);
    } else {
      variance = warp_allreduce<SumOp<float>>(squares) / count;
    }
    const float rstd = rsqrtf(variance + a.eps);
    const int64_t offset = row * a.n;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int g = p * kWarpSize + lane;
      if (g >= groups) continue;
      const uint4 w = reinterpret_cast<const uint4*>(a.weight)[g];
      const uint4 b = kCentered ? reinterpret_cast<const uint4*>(a.bias)[g] : uint4{};
      float y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[j] = (word_element<T>(packs[p], j) - mean) * rstd * word_element<T>(w, j);
        if constexpr (kCentered) y[j] += word_element<T>(b, j);
      }
      reinterpret_cast<uint4*>(a.y + offset)[g] = words_of<T>(y);
    }
    if (lane == 0) {
      if constexpr (kCentered) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
}

template <typename Math>
void run(Timer& timer, int sms, int64_t rows, int64_t n) {
  ForwardCase<T, Math> c(timer, rows, n, false);
  NormForwardArgs<T>& a = c.args;
  const int64_t packs = ceil_div(n, int64_t(kWarpSize) * 8);
  const auto time = [&](auto kernel, const char* what, int64_t blocks) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, 0));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    // 0: one wave of the kernel's blocks; -k: a k-th of one.
    if (blocks <= 0) blocks = int64_t(per_sm) * sms / (blocks == 0 ? 1 : -blocks);
    CHECK(cudaMemset(a.y, 0, c.buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<blocks, 128>>>(a); });
    std::printf("| %s | (%lld, %lld) | %s | %d regs, %d an SM, %lld blocks | %.1f | %.1f | %.1f | %.3f | %.3g |\n",
                c.name, (long long)rows, (long long)n, what, attributes.numRegs, per_sm, (long long)blocks,
                c.copy_us, c.launcher_us, us, c.launcher_us / us, c.difference());
  };
  with_exact_count(packs, std::integer_sequence<int, 3, 4, 5, 6, 7>{}, [&](auto count) {
    constexpr int kPacks = decltype(count)::value;
    const int64_t one_each = ceil_div(rows, int64_t(4));
    time(walk_rows<kPacks, Math::kCentered, false>, "a row a warp", one_each);
    time(walk_rows<kPacks, Math::kCentered, false>, "walk, one wave", 0);
    time(walk_rows<kPacks, Math::kCentered, true>, "walk, prefetch, one wave", 0);
    time(walk_rows<kPacks, Math::kCentered, true>, "walk, prefetch, half wave", -2);
    return cudaSuccess;
  });
}

int main() {
  Timer timer;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("| norm | shape | kernel | registers, blocks | copy µs | launcher µs | kernel µs | launcher / kernel | max |y diff| |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 1600}, {8192, 768}, {32768, 1024}, {16384, 1280}, {4096, 1792}};
  for (int round = 0; round < 2; ++round)
    for (auto [rows, n] : shapes) {
      run<LayerNormMath>(timer, sms, rows, n);
      run<RmsNormMath>(timer, sms, rows, n);
    }
  return 0;
}
