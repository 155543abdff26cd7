// Whether the softmax forward of wide bf16 rows split over a cluster gains
// from loading the next row during the exchange, as the float norm walks do
// (pipelined_rows.cu). Each cluster walks rows k, k + G, ...; a block holds
// its share of a row as raw 16-byte words, sums exp2 of its elements against
// the row's first value with their maximum (one reduction, as the
// launcher's two-byte rows), pushes the pair to every block of the cluster
// and, pipelined, issues the loads of its share of the next row before it
// waits for the others' pairs; unpipelined, only after its output pass. The
// output recomputes each exp2 (no floats held across the exchange). Rows of
// values in [-4, 4), so the shifted sums cannot overflow (the launcher's
// fallback for rows that could is not modelled). Against the launcher and a
// copy of the same bytes; y checked against the launcher's.
// bash bench/micro/run.sh pipelined_softmax
#include <cuda_bf16.h>

#include "../../csrc/kernels/cluster_exchange.cuh"
#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/rows.h"
#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;
using T = __nv_bfloat16;

template <int kPacks>
struct Share {
  uint4 packs[kPacks];
};

template <int kPacks, bool kPipelined>
__global__ void __launch_bounds__(512) softmax_rows(const T* x_, T* y_, int64_t rows, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters
  const int blocks = cluster_blocks(), rank = cluster_block_rank();
  cluster::open_inboxes();
  __shared__ TopAndSum<float> scratch[kWarpSize];
  const int64_t row_packs = n / 8, groups = gridDim.x / blocks;
  const int64_t first = rank * int64_t(kPacks) * blockDim.x + threadIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(x_);
  uint4* y = reinterpret_cast<uint4*>(y_);
  constexpr float kScale = 1.4426950408889634f;  // log2(e): softmax in base 2
  auto load = [&](Share<kPacks>& s, int64_t row) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) s.packs[p] = x[row * row_packs + first + p * blockDim.x];
  };
  int turn = 0;
  auto step = [&](Share<kPacks>& cur, Share<kPacks>& next, int64_t row) {
    const float shift = kScale * __bfloat162float(x_[row * n]);
    TopAndSum<float> mine = TopAndSumOp<float>::identity();
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&cur.packs[p]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        mine.top = fmaxf(mine.top, fmaxf(f.x, f.y) * kScale);
        mine.sum += exp2_acc(fmaf(f.x, kScale, -shift)) + exp2_acc(fmaf(f.y, kScale, -shift));
      }
    }
    const TopAndSum<float> block = block_allreduce<TopAndSumOp<float>>(mine, scratch);
    cluster::push(block, turn, blocks, rank);
    const bool more = row + groups < rows;
    if (kPipelined && more) load(next, row + groups);
    const TopAndSum<float> total =
        cluster::combine<TopAndSumOp<float>>(cluster::collect<TopAndSum<float>>(turn), blocks);
    ++turn;
    const float inv = 1.0f / total.sum;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&cur.packs[p]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        h[k] = __floats2bfloat162_rn(exp2_acc(fmaf(f.x, kScale, -shift)) * inv,
                                     exp2_acc(fmaf(f.y, kScale, -shift)) * inv);
      }
      y[row * row_packs + first + p * blockDim.x] = cur.packs[p];
    }
    if (!kPipelined && more) load(next, row + groups);
    return more;
  };
  Share<kPacks> even, odd;
  int64_t row = blockIdx.x / blocks;
  if (row >= rows) return;
  load(even, row);
  // Unrolled by two, so the two shares swap roles without moves.
  while (step(even, odd, row) && step(odd, even, row + groups)) row += 2 * groups;
#endif
}

template <int kPacks, bool kPipelined>
void run(Timer& timer, const T* x, T* y, int64_t rows, int64_t n, int cluster, float copy, float launcher,
         const std::vector<T>& launcher_y) {
  const auto kernel = softmax_rows<kPacks, kPipelined>;
  const int threads = int(n / 8 / cluster / kPacks);
  if (threads < 32 || threads > 512 || int64_t(threads) * kPacks * cluster * 8 != n) return;
  CHECK(rows::allow_clusters(kernel, cluster, 0));
  const int resident = rows::resident_clusters(kernel, cluster, threads, 0);
  cudaLaunchAttribute attribute = rows::cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(std::min<int64_t>(rows, resident) * cluster));
  config.blockDim = dim3(unsigned(threads));
  config.attrs = &attribute;
  config.numAttrs = 1;
  CHECK(cudaMemset(y, 0, rows * n * sizeof(T)));
  const float us = timer.median_us([&] { CHECK(cudaLaunchKernelEx(&config, kernel, x, y, rows, n)); });
  std::vector<T> ours(rows * n);
  CHECK(cudaMemcpy(ours.data(), y, rows * n * sizeof(T), cudaMemcpyDeviceToHost));
  float worst = 0;
  for (int64_t i = 0; i < rows * n; ++i)
    worst = std::max(worst, std::fabs(float(ours[i]) - float(launcher_y[i])));
  std::printf("| (%lld, %lld) | %s | %d x %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n",
              (long long)rows, (long long)n, kPipelined ? "pipelined" : "unpipelined", threads, kPacks, cluster,
              resident, copy, launcher, us, copy / launcher, copy / us, worst);
}

void shape(Timer& timer, int64_t rows, int64_t n) {
  T *x, *y;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  const float copy = timer.copy_us(x, y, rows * n * int64_t(sizeof(T)));
  const SoftmaxShape softmax{DType::BFloat16, rows, n, /*causal=*/0, /*scale=*/1.0, "probe"};
  const SoftmaxForwardBuffers io{x, y};
  const float launcher = timer.median_us([&] { CHECK(softmax_forward(softmax, io, nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), y, rows * n * sizeof(T), cudaMemcpyDeviceToHost));
  for (int cluster : {2, 4, 8, 16}) {
    run<4, false>(timer, x, y, rows, n, cluster, copy, launcher, launcher_y);
    run<4, true>(timer, x, y, rows, n, cluster, copy, launcher, launcher_y);
    run<8, false>(timer, x, y, rows, n, cluster, copy, launcher, launcher_y);
    run<8, true>(timer, x, y, rows, n, cluster, copy, launcher, launcher_y);
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
}

int main() {
  Timer timer;
  std::printf(
      "| shape | kernel | threads x packs | cluster | resident clusters | copy µs | launcher µs | µs | launcher of "
      "copy | of copy | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  shape(timer, 4096, 32768);
  shape(timer, 2048, 65536);
  shape(timer, 1024, 131072);
  shape(timer, 512, 262144);
  return 0;
}
