// The norm forward's kernel variants for rows of one block (1025-16384
// wide), against the launcher's choice: walking (a grid of the blocks that
// fit at once, each taking rows k, k + G, ... with its weight and bias packs
// copied once into shared memory, where one-row blocks read them per row
// from L2: 3-6 µs of 127 at bf16 (8192, 16384) in stream_shapes.cu), and one
// row a block with and without preloaded and staged parameters. Prints µs,
// the copy of the same bytes, and the largest |y| difference from the
// launcher's output. bash bench/micro/run.sh norm_row_variants
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;
using rows::block_lane_threads;

template <typename T, typename Math, int kPacks>
void run(Timer& timer, int sms, int64_t rows, int64_t n, const char* dtype_name) {
  using A = opmath_t<T>;
  constexpr int kVec = Vec16<T>::kSize;
  const NormRows<T, Math> buffers(rows, n, rows);
  NormForwardArgs<T> a = buffers.args;
  const NormShape shape{std::is_same_v<T, float> ? DType::Float : DType::BFloat16, rows, n,
                        Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{a.x, nullptr, a.weight, a.bias, a.y, nullptr, Math::kCentered ? a.mean : nullptr,
                                a.rstd};
  T* copy_out;
  CHECK(cudaMalloc(&copy_out, buffers.bytes()));
  const float copy = timer.copy_us(a.x, copy_out, buffers.bytes());
  const float launcher = timer.median_us([&] { CHECK(norm_forward(shape, io, double(A(1e-5)), nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), a.y, buffers.bytes(), cudaMemcpyDeviceToHost));

  const int threads = block_lane_threads(n / kVec);
  auto time_kernel = [&](auto kernel, const char* what, int64_t grid, size_t shared) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
    if (grid == 0) grid = std::min<int64_t>(rows, int64_t(per_sm) * sms);
    CHECK(cudaMemset(a.y, 0, buffers.bytes()));
    const float us = timer.median_us([&] { kernel<<<grid, threads, shared>>>(a); });
    std::printf("| %s | %s | (%lld, %lld) | %s: %d x %d, %d an SM | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n",
                Math::kCentered ? "layer_norm" : "rms_norm", dtype_name, (long long)rows, (long long)n, what, threads,
                kPacks, per_sm, copy, launcher, us, copy / launcher, copy / us, largest_difference(a.y, launcher_y));
  };
  const size_t walk_shared = size_t(kPacks) * threads * kWalkSlotBytes<T, kVec, Math>;
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, true>, "walk", 0, walk_shared);
  const size_t staged = kStagesWeight<T, Math> ? size_t(kPacks) * threads * sizeof(VecN<T, kVec>) : 0;
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack>, "one row", rows, 0);
  time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>, "one row, preload", rows, 0);
  if (staged) {
    time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack>, "one row, staged", rows,
                staged);
    time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>, "one row, preload, staged",
                rows, staged);
  }
  CHECK(cudaFree(copy_out));
}

template <typename T>
void widths(Timer& timer, int sms, const char* name) {
  constexpr int kVec = Vec16<T>::kSize;
  const std::pair<int64_t, int64_t> shapes[] = {{8192, 1600}, {8192, 4096}, {4096, 8192}, {8192, 16384}};
  for (auto [rows, n] : shapes) {
    if (n / kVec > kRowThreadsMax * 4) continue;
    const bool three = ceil_div(n / kVec, int64_t(block_lane_threads(n / kVec))) <= 3;
    if (three) {
      run<T, LayerNormMath, 3>(timer, sms, rows, n, name);
      run<T, RmsNormMath, 3>(timer, sms, rows, n, name);
    } else {
      run<T, LayerNormMath, 4>(timer, sms, rows, n, name);
      run<T, RmsNormMath, 4>(timer, sms, rows, n, name);
    }
  }
}

int main() {
  Timer timer;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "| norm | dtype | shape | kernel: threads x packs | copy µs | launcher µs | kernel µs | launcher of copy | kernel of "
      "copy | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|\n");
  widths<__nv_bfloat16>(timer, sms, "bfloat16");
  widths<float>(timer, sms, "float32");
  return 0;
}
