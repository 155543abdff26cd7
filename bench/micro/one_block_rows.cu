// rms_norm and layer_norm bf16 rows in one block of up to 1024 threads a row, no cluster
// (Liger's layout: rows of 32768 in 1024 threads at 4 packs), against the launcher (at 32768:
// the pipelined kernel in a cluster of 8 blocks of 64, the launchers' blocks are capped at
// kRowThreadsMax = 512 threads) and a copy of the same bytes. The question: does a bigger block beat the cluster
// on the H100, where bench/peers.py had Liger at 175.8 µs, the launcher at 183.2, the copy 173.1?
//   bash bench/micro/run.sh one_block_rows
#include <cuda_bf16.h>

#include <vector>

#include "norm_rows.cuh"
using namespace fastreduce;
using T = __nv_bfloat16;

// kCentered: layer_norm (sums against the row's first value, both in one block reduction).
template <int kThreads, int kPacks, bool kCentered>
__global__ void __launch_bounds__(kThreads)
    one_block_row(const uint4* x, const uint4* w, const uint4* bias, uint4* y, float* mean_out, float* rstd_out,
                  int n, float eps) {
  const int64_t row = blockIdx.x;
  const int groups = n / 8;
  const uint4* xr = x + row * groups;
  uint4 p[kPacks];
#pragma unroll
  for (int i = 0; i < kPacks; ++i) p[i] = xr[threadIdx.x + i * kThreads];
  const float shift = kCentered ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(xr)[0]) : 0.f;
  Deviations<float> s(0);  // of x - shift: its sum and sum of squares
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&p[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      s.add(f.x - shift);
      s.add(f.y - shift);
    }
  }
  __shared__ Deviations<float> scratch[kWarpSize];
  s = block_allreduce<SumOp<Deviations<float>>>(s, scratch);
  const float offset = kCentered ? s.sum / n : 0.f, mean = shift + offset;
  const float r = rsqrtf(s.squares / n - offset * offset + eps);
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const uint4 wp = w[threadIdx.x + i * kThreads];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&p[i]);
    const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wp);
    uint4 bp{};
    if constexpr (kCentered) bp = bias[threadIdx.x + i * kThreads];
    const __nv_bfloat162* bh = reinterpret_cast<const __nv_bfloat162*>(&bp);
    uint4 o;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]), g = __bfloat1622float2(wh[j]), c = __bfloat1622float2(bh[j]);
      oh[j] = __floats2bfloat162_rn((f.x - mean) * r * g.x + c.x, (f.y - mean) * r * g.y + c.y);
    }
    y[row * groups + threadIdx.x + i * kThreads] = o;
  }
  if (threadIdx.x == 0) {
    if constexpr (kCentered) mean_out[row] = mean;
    rstd_out[row] = r;
  }
}

template <int kThreads, int kPacks, typename Math>
void time_one_block(Timer& timer, const NormRows<T, Math>& b, float copy, float launcher,
                    const std::vector<T>& launcher_y) {
  const int n = int(b.args.n);
  if (kThreads * kPacks * 8 != n) return;
  const float us = timer.median_us([&] {
    one_block_row<kThreads, kPacks, Math::kCentered><<<b.args.rows, kThreads>>>(
        (const uint4*)b.x, (const uint4*)b.w, (const uint4*)b.b, (uint4*)b.y, b.mean, b.rstd, n, 1e-5f);
    CHECK(cudaGetLastError());
  });
  std::printf("| %s bf16 (%lld, %d) | one block %d x %d packs | %.1f | %.1f | %.1f | %.3g |\n",
              Math::kCentered ? "layer_norm" : "rms_norm", (long long)b.args.rows, n, kThreads, kPacks, copy,
              launcher, us, largest_difference(b.y, launcher_y));
}

template <typename Math>
void shape(Timer& timer, int64_t rows, int64_t n) {
  NormRows<T, Math> b(rows, n, rows);
  const float copy = timer.copy_us(b.x, b.y, b.bytes());
  const NormShape shape{DType::BFloat16, rows, n, Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{b.x, nullptr, b.w, Math::kCentered ? b.b : nullptr, b.y, nullptr,
                                Math::kCentered ? b.mean : nullptr, b.rstd};
  const float launcher = timer.median_us([&] { CHECK(norm_forward(shape, io, 1e-5, nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), b.y, b.bytes(), cudaMemcpyDeviceToHost));
  time_one_block<1024, 4>(timer, b, copy, launcher, launcher_y);
  time_one_block<1024, 2>(timer, b, copy, launcher, launcher_y);
  time_one_block<512, 4>(timer, b, copy, launcher, launcher_y);
  time_one_block<1024, 8>(timer, b, copy, launcher, launcher_y);
}

int main() {
  Timer timer;
  std::printf("| norm, shape | blocks | copy µs | launcher µs | µs | max |y diff| |\n|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 32768}, {8192, 16384}, {2048, 65536}}) {
    shape<RmsNormMath>(timer, rows, n);
    shape<LayerNormMath>(timer, rows, n);
  }
}
