// rms_norm bf16 rows in one block of up to 1024 threads a row, no cluster (Liger's layout:
// rows of 32768 in 1024 threads at 4 packs), against the launcher (at 32768: the pipelined
// kernel in a cluster of 8 blocks of 64, the launchers' blocks are capped at kRowThreadsMax =
// 512 threads) and a copy of the same bytes. The question: does a bigger block beat the cluster
// on the H100, where bench/peers.py had Liger at 175.8 µs, the launcher at 183.2, the copy 173.1?
//   bash bench/micro/run.sh one_block_rows
#include <cuda_bf16.h>

#include <vector>

#include "norm_rows.cuh"
using namespace fastreduce;
using T = __nv_bfloat16;

template <int kThreads, int kPacks>
__global__ void __launch_bounds__(kThreads) one_block_row(const uint4* x, const uint4* w, uint4* y, float* rstd_out, int n, float eps) {
  const int64_t row = blockIdx.x;
  const int groups = n / 8;
  const uint4* xr = x + row * groups;
  uint4 p[kPacks];
#pragma unroll
  for (int i = 0; i < kPacks; ++i) p[i] = xr[threadIdx.x + i * kThreads];
  float s = 0;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&p[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) { float2 f = __bfloat1622float2(h[j]); s += f.x * f.x + f.y * f.y; }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  __shared__ float part[kThreads / 32];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  s = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.f;
  if (threadIdx.x < 32) {
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (threadIdx.x == 0) part[0] = s;
  }
  __syncthreads();
  const float r = rsqrtf(part[0] / n + eps);
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const uint4 wp = w[threadIdx.x + i * kThreads];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&p[i]);
    const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wp);
    uint4 o;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __bfloat1622float2(h[j]), g = __bfloat1622float2(wh[j]);
      oh[j] = __floats2bfloat162_rn(f.x * r * g.x, f.y * r * g.y);
    }
    y[row * groups + threadIdx.x + i * kThreads] = o;
  }
  if (threadIdx.x == 0) rstd_out[row] = r;
}

template <int kThreads, int kPacks>
void time_one_block(Timer& timer, const NormRows<T, RmsNormMath>& b, float copy, float launcher,
                    const std::vector<T>& launcher_y) {
  const int n = int(b.args.n);
  if (kThreads * kPacks * 8 != n) return;
  const float us = timer.median_us([&] {
    one_block_row<kThreads, kPacks><<<b.args.rows, kThreads>>>((const uint4*)b.x, (const uint4*)b.w, (uint4*)b.y, b.rstd, n, 1e-5f);
    CHECK(cudaGetLastError());
  });
  std::printf("| rms_norm bf16 (%lld, %d) | one block %d x %d packs | copy %.1f | launcher %.1f | %.1f | %.3g |\n",
              (long long)b.args.rows, n, kThreads, kPacks, copy, launcher, us, largest_difference(b.y, launcher_y));
}

int main() {
  Timer timer;
  std::printf("| shape | blocks | copy µs | launcher µs | µs | max |y diff| |\n|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 32768}, {8192, 16384}, {2048, 65536}}) {
    NormRows<T, RmsNormMath> b(rows, n, rows);
    const float copy = timer.copy_us(b.x, b.y, b.bytes());
    const NormShape shape{DType::BFloat16, rows, n, NormKind::Rms, "probe"};
    const NormForwardBuffers<> io{b.x, nullptr, b.w, nullptr, b.y, nullptr, nullptr, b.rstd};
    const float launcher = timer.median_us([&] { CHECK(norm_forward(shape, io, 1e-5, nullptr)); });
    std::vector<T> launcher_y(rows * n);
    CHECK(cudaMemcpy(launcher_y.data(), b.y, b.bytes(), cudaMemcpyDeviceToHost));
    time_one_block<1024, 4>(timer, b, copy, launcher, launcher_y);
    time_one_block<1024, 2>(timer, b, copy, launcher, launcher_y);
    time_one_block<512, 4>(timer, b, copy, launcher, launcher_y);
    time_one_block<1024, 8>(timer, b, copy, launcher, launcher_y);
  }
}
