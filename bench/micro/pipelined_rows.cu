// Whether wide rows split over a cluster gain from loading the next row
// during the exchange of the current one. rms_norm forward, bf16, weight
// read per row (L1 or L2): each cluster walks rows k, k + G, ...; a block
// holds its share of a row in registers, sums its squares, pushes the sum to
// every block of the cluster (cluster_exchange.cuh) and, pipelined, issues
// the loads of its share of the next row into a second set of registers
// before it waits for the other blocks' sums; unpipelined, only after its
// output pass (as the launcher's walking kernels do). Against the launcher
// and a copy of the same bytes; rstd checked against the launcher's.
// bash bench/micro/run.sh pipelined_rows
#include <cuda_bf16.h>

#include "../../csrc/kernels/cluster_exchange.cuh"
#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using T = __nv_bfloat16;

template <int kPacks>
struct Share {
  uint4 packs[kPacks];
};

template <int kPacks>
__device__ __forceinline__ float squares(const Share<kPacks>& s) {
  float sum = 0;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&s.packs[p]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      sum = fmaf(f.x, f.x, sum);
      sum = fmaf(f.y, f.y, sum);
    }
  }
  return sum;
}

template <int kPacks, bool kPipelined, int kMinBlocks>
__global__ void __launch_bounds__(512, kMinBlocks) rms_rows(NormForwardArgs<T> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters
  const int blocks = cluster_blocks(), rank = cluster_block_rank();
  cluster::open_inboxes();
  __shared__ float scratch[kWarpSize];
  const int64_t row_packs = a.n / 8, groups = gridDim.x / blocks;
  const int64_t first = rank * int64_t(kPacks) * blockDim.x + threadIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  const uint4* w = reinterpret_cast<const uint4*>(a.weight);
  uint4* y = reinterpret_cast<uint4*>(a.y);
  auto load = [&](Share<kPacks>& s, int64_t row) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) s.packs[p] = x[row * row_packs + first + p * blockDim.x];
  };
  int turn = 0;
  // One row: `cur` holds it; `next` receives the row `groups` on.
  auto step = [&](Share<kPacks>& cur, Share<kPacks>& next, int64_t row) {
    const float sum = block_allreduce<SumOp<float>>(squares(cur), scratch);
    cluster::push(sum, turn, blocks, rank);
    const bool more = row + groups < a.rows;
    if (kPipelined && more) load(next, row + groups);
    const float total = cluster::combine<SumOp<float>>(cluster::collect<float>(turn), blocks);
    ++turn;
    const float r = rsqrtf(total / float(a.n) + a.eps);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const uint4 wp = w[first + p * blockDim.x];
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&cur.packs[p]);
      const __nv_bfloat162* hw = reinterpret_cast<const __nv_bfloat162*>(&wp);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]), fw = __bfloat1622float2(hw[k]);
        h[k] = __floats2bfloat162_rn(f.x * r * fw.x, f.y * r * fw.y);
      }
      y[row * row_packs + first + p * blockDim.x] = cur.packs[p];
    }
    if (rank == 0 && threadIdx.x == 0) a.rstd[row] = r;
    if (!kPipelined && more) load(next, row + groups);
    return more;
  };
  Share<kPacks> even, odd;
  int64_t row = blockIdx.x / blocks;
  if (row >= a.rows) return;
  load(even, row);
  // Unrolled by two, so the two shares swap roles without moves.
  while (step(even, odd, row) && step(odd, even, row + groups)) row += 2 * groups;
#endif
}

template <int kPacks, bool kPipelined, int kMinBlocks = 1>
void run(Timer& timer, const NormRows<T, RmsNormMath>& buffers, int cluster, float copy, float launcher,
         const std::vector<float>& launcher_rstd, const char* shape) {
  const auto kernel = rms_rows<kPacks, kPipelined, kMinBlocks>;
  const NormForwardArgs<T> a = buffers.args;
  const int threads = int(a.n / 8 / cluster / kPacks);
  if (threads > 512 || threads * kPacks * cluster * 8 != a.n) return;
  CHECK(rows::allow_clusters(kernel, cluster, 0));
  const int resident = rows::resident_clusters(kernel, cluster, threads, 0);
  cudaLaunchAttribute attribute = rows::cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(std::min<int64_t>(a.rows, resident) * cluster));
  config.blockDim = dim3(unsigned(threads));
  config.attrs = &attribute;
  config.numAttrs = 1;
  CHECK(cudaMemset(a.rstd, 0, a.rows * sizeof(float)));
  const float us = timer.median_us([&] { CHECK(cudaLaunchKernelEx(&config, kernel, a)); });
  std::vector<float> rstd(a.rows);
  CHECK(cudaMemcpy(rstd.data(), a.rstd, a.rows * sizeof(float), cudaMemcpyDeviceToHost));
  float worst = 0;
  for (int64_t i = 0; i < a.rows; ++i) worst = std::max(worst, std::fabs(rstd[i] - launcher_rstd[i]));
  std::printf("| %s | %s%s | %d x %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n", shape,
              kPipelined ? "pipelined" : "unpipelined", kMinBlocks > 1 ? ", 64 registers" : "", threads, kPacks, cluster, resident, copy, launcher, us,
              copy / launcher, copy / us, worst);
}

void shape(Timer& timer, int64_t rows, int64_t n) {
  const NormRows<T, RmsNormMath> buffers(rows, n, rows);
  const NormForwardArgs<T> a = buffers.args;
  T* copy_out;
  CHECK(cudaMalloc(&copy_out, buffers.bytes()));
  const float copy = timer.copy_us(a.x, copy_out, buffers.bytes());
  const NormShape norm{DType::BFloat16, rows, n, NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{a.x, nullptr, a.weight, nullptr, a.y, nullptr, nullptr, a.rstd};
  const float launcher = timer.median_us([&] { CHECK(norm_forward(norm, io, 1e-5, nullptr)); });
  std::vector<float> launcher_rstd(rows);
  CHECK(cudaMemcpy(launcher_rstd.data(), a.rstd, rows * sizeof(float), cudaMemcpyDeviceToHost));
  char name[64];
  std::snprintf(name, sizeof name, "(%lld, %lld)", (long long)rows, (long long)n);
  for (int cluster : {2, 4, 8, 16}) {
    run<4, false>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
    run<4, true>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
    run<4, false, 2>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
    run<4, true, 2>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
    run<8, false>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
    run<8, true>(timer, buffers, cluster, copy, launcher, launcher_rstd, name);
  }
  CHECK(cudaFree(copy_out));
}

int main() {
  Timer timer;
  std::printf(
      "| shape | kernel | threads x packs | cluster | resident clusters | copy µs | launcher µs | µs | launcher of "
      "copy | of copy | max |rstd diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  shape(timer, 4096, 32768);
  shape(timer, 2048, 65536);
  shape(timer, 1024, 131072);
  shape(timer, 512, 262144);
  return 0;
}
