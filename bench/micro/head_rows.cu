// The norm forward of head-size rows (64-512 wide, bf16), where torch.compile's
// persistent reduction ran 8-24% ahead of the launcher's several-rows-a-warp
// kernel in kernel time (H200, bench/peers.py's machinery at those shapes).
// Times the launcher and its kernel (compiled for any parameters, and for
// every one given: kAffine) against a lean kernel of the same layout, its
// statistics stored in several ways or not at all. Prints µs, the copy of
// the same bytes and the largest |y| difference from the launcher's output.
//   bash bench/micro/run.sh head_rows
// H200 (NOTES, 2026-12-01): eight-warp blocks lost 1-2 µs to four at
// layer_norm; the statistics' stores a row cost 1.5-3.5 µs of 33-37 (none
// stored: within 2-4% of the copy), gathered into the warp's lanes 0.5-1.3
// (the kind of store made no difference); 16 lanes of three packs ran
// 384-wide rows in 26.7 µs where 32 lanes of two took 32.4; streaming
// hints lost 1-4%. The launcher's layer_norm kernel compiled for any
// parameters ran 0.7-1.3 µs behind the kAffine one, which is within 0.1-0.6
// of the lean kernel with gathered statistics.
#include <cuda_bf16.h>

#include "../../csrc/kernels/norm_kernels.cuh"
#include "../../csrc/launch/norms.h"
#include "probe.cuh"

using namespace fastreduce;
using T = __nv_bfloat16;

__device__ __forceinline__ float low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float element(const uint4& v, int j) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  return j % 2 ? high(w[j / 2]) : low(w[j / 2]);
}
__device__ __forceinline__ uint4 pack(const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
    memcpy(&w[k], &pair, 4);
  }
  return {w[0], w[1], w[2], w[3]};
}

template <int kLanes>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// How the lean kernel stores a row's mean and rstd: not at all, a store a
// row from the row's first lane, gathered into the warp's lanes and stored
// at once (as the launcher's kernel), the same with st.global.cs, or four
// rows' to a lane as one 16-byte store.
enum class Stats { kNone, kPerRow, kGathered, kGatheredStreaming, kGatheredVector };

// kLanes lanes a row, kPacks packs a lane, kSteps rows a lane loaded before
// the reductions, kWarps warps a block; kStreaming: ld.global.cs / st.global.cs.
template <int kLanes, int kPacks, int kSteps, int kWarps, bool kCentered, bool kStreaming,
          Stats kStats = Stats::kPerRow>
__global__ void __launch_bounds__(kWarps * 32) head_rows(NormForwardArgs<T> a) {
  constexpr int kSegments = 32 / kLanes;
  const int lane = threadIdx.x % 32, n = int(a.n);
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t first = warp * (kSegments * kSteps) + lane / kLanes;
  const auto column = [&](int q) { return lane % kLanes + q * kLanes; };
  const auto in_row = [&](int q) { return column(q) < n / 8; };
  uint4 packs[kSteps][kPacks];
#pragma unroll
  for (int k = 0; k < kSteps; ++k)
#pragma unroll
    for (int q = 0; q < kPacks; ++q) {
      const int64_t row = first + int64_t(k) * kSegments;
      const uint4* p = reinterpret_cast<const uint4*>(a.x + row * n) + column(q);
      packs[k][q] = in_row(q) && row < a.rows ? (kStreaming ? __ldcs(p) : *p) : uint4{};
    }
  uint4 w[kPacks], b[kPacks];
#pragma unroll
  for (int q = 0; q < kPacks; ++q) {
    w[q] = in_row(q) ? reinterpret_cast<const uint4*>(a.weight)[column(q)] : uint4{};
    if (kCentered) b[q] = in_row(q) ? reinterpret_cast<const uint4*>(a.bias)[column(q)] : uint4{};
  }
  constexpr int kRows = kSegments * kSteps;
  float lane_mean = 0, lane_rstd = 0;
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    float mean = 0, squares = 0;
    if (kCentered) {
      float sum = 0;
#pragma unroll
      for (int q = 0; q < kPacks; ++q)
#pragma unroll
        for (int j = 0; j < 8; ++j) sum += element(packs[k][q], j);
      mean = row_sum<kLanes>(sum) / n;
    }
#pragma unroll
    for (int q = 0; q < kPacks; ++q)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = element(packs[k][q], j) - mean;
        squares += in_row(q) ? d * d : 0.f;
      }
    const float rstd = rsqrtf(row_sum<kLanes>(squares) / n + a.eps);
    if constexpr (kStats >= Stats::kGathered) {
      const int from = (lane % kSegments) * kLanes;
      const float m = __shfl_sync(0xffffffffu, mean, from), r = __shfl_sync(0xffffffffu, rstd, from);
      if (lane / kSegments == k) lane_mean = m, lane_rstd = r;
    }
    const int64_t row = first + int64_t(k) * kSegments;
    if (row >= a.rows) continue;
#pragma unroll
    for (int q = 0; q < kPacks; ++q) {
      if (!in_row(q)) continue;
      float out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        out[j] = (element(packs[k][q], j) - mean) * rstd * element(w[q], j);
        if (kCentered) out[j] += element(b[q], j);
      }
      uint4* p = reinterpret_cast<uint4*>(a.y + row * n) + column(q);
      if (kStreaming) __stcs(p, pack(out));
      else *p = pack(out);
    }
    if (kStats == Stats::kPerRow && lane % kLanes == 0) {
      if (kCentered) a.mean[row] = mean;
      a.rstd[row] = rstd;
    }
  }
  const int64_t base = warp * kRows;  // rows a multiple of kRows here
  if constexpr (kStats == Stats::kGathered || kStats == Stats::kGatheredStreaming) {
    if (lane < kRows) {
      if (kStats == Stats::kGathered) {
        if (kCentered) a.mean[base + lane] = lane_mean;
        a.rstd[base + lane] = lane_rstd;
      } else {
        if (kCentered) __stcs(a.mean + base + lane, lane_mean);
        __stcs(a.rstd + base + lane, lane_rstd);
      }
    }
  } else if constexpr (kStats == Stats::kGatheredVector) {
    float4 m, r;  // lane i: rows 4i..4i+3, from lanes 4i..4i+3
    float* mf = &m.x;
    float* rf = &r.x;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      mf[t] = __shfl_sync(0xffffffffu, lane_mean, (4 * lane + t) % 32);
      rf[t] = __shfl_sync(0xffffffffu, lane_rstd, (4 * lane + t) % 32);
    }
    if (lane < kRows / 4) {
      if (kCentered) reinterpret_cast<float4*>(a.mean + base)[lane] = m;
      reinterpret_cast<float4*>(a.rstd + base)[lane] = r;
    }
  }
}

// Times `kernel` launched with kWarps warps a block, each warp taking
// rows_per_warp rows, against the launcher's output.
template <typename Kernel>
void time_kernel(Timer& timer, Kernel kernel, const char* name, int warps, int64_t rows_per_warp,
                 const NormForwardArgs<T>& a, T* reference, float copy, float launcher) {
  const int64_t rows_per_block = warps * rows_per_warp, blocks = (a.rows + rows_per_block - 1) / rows_per_block;
  CHECK(cudaMemset(a.y, 0, a.rows * a.n * sizeof(T)));
  const float us = timer.median_us([&] { kernel<<<blocks, warps * 32>>>(a); });
  std::vector<T> host(a.rows * a.n);
  CHECK(cudaMemcpy(host.data(), reference, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  const float difference = largest_difference(a.y, host);
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * 32, 0));
  std::printf("| %s (%lld, %lld) | %s, %d warps a block | %d regs, %d warps an SM | %.1f | %.1f | %.1f | %.2f | "
              "%.3g |\n",
              a.mean ? "layer_norm" : "rms_norm", (long long)a.rows, (long long)a.n, name, warps, registers(kernel),
              per_sm * warps, copy, launcher, us, copy / us, difference);
}

// The lean kernel: kSteps rows a lane, kWarps warps a block.
template <int kLanes, int kPacks, int kSteps, int kWarps, bool kCentered, bool kStreaming = false,
          Stats kStats = Stats::kPerRow>
void time_lean(Timer& timer, const NormForwardArgs<T>& a, T* reference, float copy, float launcher) {
  char name[96];
  const char* stats[] = {", no statistics", "", ", statistics gathered", ", statistics gathered, st.cs",
                         ", statistics gathered, 16-byte stores"};
  std::snprintf(name, sizeof(name), "lean %d lanes x %d packs, %d steps%s%s", kLanes, kPacks, kSteps,
                kStreaming ? ", streaming" : "", stats[int(kStats)]);
  time_kernel(timer, head_rows<kLanes, kPacks, kSteps, kWarps, kCentered, kStreaming, kStats>, name, kWarps,
              (32 / kLanes) * kSteps, a, reference, copy, launcher);
}

// The launcher's kernel at another block size, compiled for any parameters
// or for every one given (kAffine, which the launcher runs here).
template <int kLanes, int kPacks, bool kCentered, bool kAffine>
void time_launcher_kernel(Timer& timer, int warps, const NormForwardArgs<T>& a, T* reference, float copy,
                          float launcher) {
  using Math = std::conditional_t<kCentered, LayerNormMath, RmsNormMath>;
  time_kernel(timer, norm_forward_short_rows_kernel<T, kLanes, Math, T, kPacks, false, kAffine>,
              kAffine ? "the launcher's kernel, kAffine" : "the launcher's kernel, any parameters", warps,
              kShortRowsPerWarp<kLanes, kPacks>, a, reference, copy, launcher);
}

template <int kLanes, int kPacks, bool kCentered>
void sweep(Timer& timer, int64_t rows) {
  constexpr int kSegments = 32 / kLanes;
  const int64_t n = int64_t(kLanes) * kPacks * 8, count = rows * n;
  T *x, *y, *reference, *w, *b, *copy_out;
  float *mean, *rstd;
  CHECK(cudaMalloc(&x, count * 2));
  CHECK(cudaMalloc(&y, count * 2));
  CHECK(cudaMalloc(&reference, count * 2));
  CHECK(cudaMalloc(&copy_out, count * 2));
  CHECK(cudaMalloc(&w, n * 2));
  CHECK(cudaMalloc(&b, n * 2));
  CHECK(cudaMalloc(&mean, rows * 4));
  CHECK(cudaMalloc(&rstd, rows * 4));
  fill_uniform<<<1024, 256>>>(x, count, 1, -2.f, 5.f);
  fill_uniform<<<64, 256>>>(w, n, 2, 0.5f, 1.f);
  fill_uniform<<<64, 256>>>(b, n, 3, -1.f, 2.f);
  NormForwardArgs<T> a{};
  a.x = x, a.y = reference, a.weight = w, a.bias = kCentered ? b : nullptr, a.mean = kCentered ? mean : nullptr;
  a.rstd = rstd, a.rows = rows, a.n = n, a.eps = 1e-5f;
  const NormShape shape{DType::BFloat16, rows, n, kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{x, nullptr, w, a.bias, reference, nullptr, a.mean, rstd};
  const auto launch = [&] { CHECK(norm_forward(shape, io, 1e-5, nullptr)); };
  const float copy = timer.copy_us(x, copy_out, count * 2);
  const float launcher = timer.median_us(launch);
  a.y = y;
  time_launcher_kernel<kLanes, kPacks, kCentered, false>(timer, kShortRowWarps, a, reference, copy, launcher);
  time_launcher_kernel<kLanes, kPacks, kCentered, true>(timer, kShortRowWarps, a, reference, copy, launcher);
  constexpr int kSteps = kPacks == 1 ? 4 : kPacks == 2 ? 2 : 1;
  time_lean<kLanes, kPacks, kSteps, 4, kCentered, false, Stats::kNone>(timer, a, reference, copy, launcher);
  time_lean<kLanes, kPacks, kSteps, 4, kCentered, false, Stats::kPerRow>(timer, a, reference, copy, launcher);
  time_lean<kLanes, kPacks, kSteps, 4, kCentered, false, Stats::kGathered>(timer, a, reference, copy, launcher);
  time_lean<kLanes, kPacks, kSteps, 4, kCentered, false, Stats::kGatheredStreaming>(timer, a, reference, copy,
                                                                                   launcher);
  if constexpr (kSegments * kSteps % 4 == 0)
    time_lean<kLanes, kPacks, kSteps, 4, kCentered, false, Stats::kGatheredVector>(timer, a, reference, copy,
                                                                                   launcher);
  for (void* p : {(void*)x, (void*)y, (void*)reference, (void*)copy_out, (void*)w, (void*)b, (void*)mean, (void*)rstd})
    CHECK(cudaFree(p));
}

int main() {
  Timer timer;
  std::printf("| op (rows, n) | variant | registers | copy µs | launcher µs | variant µs | copy / variant | "
              "max |dy| |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  sweep<8, 1, false>(timer, 262144);   // 64
  sweep<16, 1, false>(timer, 262144);  // 128
  sweep<16, 1, true>(timer, 262144);
  sweep<32, 1, true>(timer, 131072);  // 256
  sweep<32, 1, false>(timer, 131072);
  sweep<16, 3, true>(timer, 65536);   // 384: 16 lanes x 3 packs
  sweep<32, 2, true>(timer, 65536);   // 512
  sweep<32, 2, false>(timer, 65536);
  return 0;
}
