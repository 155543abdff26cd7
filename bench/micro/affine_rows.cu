// layer_norm's two-byte forwards without a residual, compiled for a given
// weight and bias (kAffine: no null checks or selects in the output pass)
// against the same kernels compiled for either being null, which the
// launcher ran before: warp rows of 3-7 packs a lane (768-1792 wide) and
// one-row blocks of four packs a thread (4096-16384). Prints µs, the copy of
// the same bytes and the largest |y| difference from the launcher's output,
// twice. bash bench/micro/run.sh affine_rows
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using rows::block_lane_threads;
using T = __nv_bfloat16;
using Math = LayerNormMath;
constexpr int kVec = Vec16<T>::kSize;
constexpr ParamLoads kPerPack = ParamLoads::kPerPack;

template <typename Either, typename Given>
void run(Timer& timer, int64_t rows, int64_t n, Either either, Given given, int threads, int64_t blocks,
         const char* what) {
  const NormRows<T, Math> buffers(rows, n, rows);
  NormForwardArgs<T> a = buffers.args;
  const NormShape shape{DType::BFloat16, rows, n, NormKind::Layer, "probe"};
  const NormForwardBuffers<> io{a.x, nullptr, a.weight, a.bias, a.y, nullptr, a.mean, a.rstd};
  T* copy_out;
  CHECK(cudaMalloc(&copy_out, buffers.bytes()));
  const float copy = timer.copy_us(a.x, copy_out, buffers.bytes());
  const float launcher = timer.median_us([&] { CHECK(norm_forward(shape, io, 1e-5, nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), a.y, buffers.bytes(), cudaMemcpyDeviceToHost));
  float us[2];
  double difference = 0;
  int k = 0;
  for (auto kernel : {either, given}) {
    CHECK(cudaMemset(a.y, 0, buffers.bytes()));
    us[k++] = timer.median_us([&] { kernel<<<blocks, threads>>>(a); });
    difference = std::max<double>(difference, largest_difference(a.y, launcher_y));
  }
  std::printf("| (%lld, %lld) | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.3g |\n", (long long)rows, (long long)n, what,
              copy, launcher, us[0], us[1], copy / us[1], difference);
  CHECK(cudaFree(copy_out));
}

template <int kPacks>
void warp_rows(Timer& timer, int64_t rows, int64_t n) {
  run(timer, rows, n, norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, false>,
      norm_forward_lanes_kernel<T, kPacks, kVec, true, Math, false, kPerPack, false, true>, 128, ceil_div(rows, 4),
      "warp rows");
}

void block_rows(Timer& timer, int64_t rows, int64_t n) {
  const int threads = block_lane_threads(n / kVec);
  // What the launcher took before: parameters before the output pass in
  // blocks of up to 128 threads, per pack beyond, the add's code compiled in.
  auto before = threads <= 128 ? norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, ParamLoads::kBeforeOutput>
                               : norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack>;
  run(timer, rows, n, before, norm_forward_lanes_kernel<T, 4, kVec, false, Math, false, kPerPack, false, true>,
      threads, rows, "block rows");
}

int main() {
  Timer timer;
  std::printf(
      "| shape | kernel | copy µs | launcher µs | either null µs | both given µs | given of copy | max |y diff| "
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
  }
  return 0;
}
