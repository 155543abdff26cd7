// The softmax forward of wide rows split over clusters: the launcher against
// softmax_forward_pipelined_kernel (4 or 8 packs a thread, the next row
// loaded during the exchange) in each block size and cluster (one block
// included: a walk without a cluster) that holds the row exactly, bf16 and
// float32, and a copy of the same bytes; y checked against the launcher's
// (the rows where a configuration is the launcher's own differ by 0). Rows
// that no configuration holds exactly (GPT-2's vocabularies 50304 and 50257)
// print the launcher alone.
// bash bench/micro/run.sh pipelined_softmax
#include <cuda_bf16.h>

#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/rows.h"
#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T, int kPacks>
void run(Timer& timer, const char* name, const T* x, T* y, int64_t rows, int64_t n, float copy, float launcher,
         const std::vector<T>& launcher_y) {
  constexpr int kVec = Vec16<T>::kSize;
  const auto kernel = softmax_forward_pipelined_kernel<T, kPacks, false>;
  for (int threads : {64, 128, 256, 512}) {
    const int64_t cluster = n / kVec / kPacks / threads;
    if (cluster < 1 || cluster > 16 || cluster * threads * kPacks * kVec != n) continue;
    const int resident = rows::resident_clusters(kernel, int(cluster), threads, 0);
    const auto args = std::make_tuple(x, y, rows, int(n), 1.0f);
    CHECK(cudaMemset(y, 0, rows * n * sizeof(T)));
    const float us = timer.median_us([&] {
      CHECK(rows::launch_clusters(kernel, std::min<int64_t>(rows, resident), int(cluster), threads, 0, nullptr, args));
    });
    const float worst = largest_difference(y, launcher_y);
    std::printf("| %s | (%lld, %lld) | %d x %d | %lld | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n", name,
                (long long)rows, (long long)n, threads, kPacks, (long long)cluster, resident, copy, launcher, us,
                copy / launcher, copy / us, worst);
  }
}

template <typename T>
void shape(Timer& timer, DType dtype, const char* name, int64_t rows, int64_t n) {
  T *x, *y;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  const float copy = timer.copy_us(x, y, rows * n * int64_t(sizeof(T)));
  const SoftmaxShape softmax{dtype, rows, n, /*causal=*/0, /*scale=*/1.0, "probe"};
  const SoftmaxForwardBuffers io{x, y};
  const float launcher = timer.median_us([&] { CHECK(softmax_forward(softmax, io, nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), y, rows * n * sizeof(T), cudaMemcpyDeviceToHost));
  std::printf("| %s | (%lld, %lld) | launcher | | | %.1f | %.1f | | %.2f | | |\n", name, (long long)rows,
              (long long)n, copy, launcher, copy / launcher);
  run<T, 4>(timer, name, x, y, rows, n, copy, launcher, launcher_y);
  run<T, 8>(timer, name, x, y, rows, n, copy, launcher, launcher_y);
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
}

int main() {
  Timer timer;
  std::printf(
      "| dtype | shape | threads x packs | cluster | resident clusters | copy µs | launcher µs | µs | launcher of "
      "copy | of copy | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 8192}, {8192, 16384}, {4096, 32768},
                         {2048, 65536}, {1024, 131072}, {512, 262144}, {8192, 50304}, {8192, 50257}})
    shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", rows, n);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 16384}, {2048, 32768}, {1024, 65536}, {512, 131072},
                         {256, 262144}, {8192, 50304}})
    shape<float>(timer, DType::Float, "float32", rows, n);
  return 0;
}
