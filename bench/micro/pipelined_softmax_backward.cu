// The softmax backward of wide rows split over clusters: the launcher against
// softmax_backward_pipelined_kernel (y and dy held as words, the next row's
// loaded during the dot product's exchange) in each block size and cluster
// that holds the row exactly, at four and eight packs a thread, and a copy
// of the same traffic (y and dy read, dx written); dx checked against the
// launcher's. The launcher takes the pipelined kernel for two-byte rows only.
// bash bench/micro/run.sh pipelined_softmax_backward
#include <cuda_bf16.h>

#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/rows.h"
#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T, int kPacks>
void run(Timer& timer, const char* name, const T* dy, const T* y, T* dx, int64_t rows, int64_t n, float copy,
         float launcher, const std::vector<T>& launcher_dx) {
  constexpr int kVec = Vec16<T>::kSize;
  const auto kernel = softmax_backward_pipelined_kernel<T, kPacks, false>;
  for (int threads : {128, 256, 512}) {
    const int64_t cluster = n / kVec / kPacks / threads;
    if (cluster < 2 || cluster > 16 || cluster * threads * kPacks * kVec != n) continue;
    const int resident = rows::resident_clusters(kernel, int(cluster), threads, 0);
    CHECK(cudaMemset(dx, 0, rows * n * sizeof(T)));
    const float us = timer.median_us([&] {
      CHECK(rows::launch_clusters(kernel, std::min<int64_t>(rows, resident), int(cluster), threads, 0, nullptr,
                                  std::make_tuple(dy, y, dx, rows, int(n), 1.0f)));
    });
    std::printf("| %s | (%lld, %lld) | %d x %d | %lld | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n", name,
                (long long)rows, (long long)n, threads, kPacks, (long long)cluster, resident, copy, launcher, us,
                copy / launcher, copy / us, largest_difference(dx, launcher_dx));
  }
}

template <typename T>
void shape(Timer& timer, DType dtype, const char* name, int64_t rows, int64_t n) {
  const int64_t bytes = rows * n * int64_t(sizeof(T));
  T *dy, *y, *dx;
  CHECK(cudaMalloc(&dy, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&dx, 2 * bytes));  // also the copy's 1.5 rows of traffic
  fill_uniform<<<1024, 256>>>(dy, rows * n, 1u, -1.0f, 2.0f);
  fill_uniform<<<1024, 256>>>(y, rows * n, 2u, 0.0f, 1.0f / float(n));
  const float copy = timer.copy_us(dy, dx, bytes * 3 / 2);
  const SoftmaxShape softmax{dtype, rows, n, /*causal=*/0, /*scale=*/1.0, "probe"};
  const SoftmaxBackwardBuffers io{dy, y, dx};
  const float launcher = timer.median_us([&] { CHECK(softmax_backward(softmax, io, nullptr)); });
  std::vector<T> launcher_dx(rows * n);
  CHECK(cudaMemcpy(launcher_dx.data(), dx, bytes, cudaMemcpyDeviceToHost));
  run<T, 4>(timer, name, dy, y, dx, rows, n, copy, launcher, launcher_dx);
  run<T, 8>(timer, name, dy, y, dx, rows, n, copy, launcher, launcher_dx);
  for (T* p : {dy, y, dx}) CHECK(cudaFree(p));
}

int main() {
  Timer timer;
  std::printf(
      "| dtype | shape | threads x packs | cluster | resident clusters | copy µs | launcher µs | µs | launcher of "
      "copy | of copy | max |dx diff| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 32768}, {2048, 65536}, {1024, 131072}, {512, 262144}})
    shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", rows, n);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{2048, 32768}, {1024, 65536}, {512, 131072}})
    shape<float>(timer, DType::Float, "float32", rows, n);
  return 0;
}
