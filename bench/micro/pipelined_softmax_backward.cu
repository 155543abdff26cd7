// Whether the softmax backward of wide rows split over clusters gains from
// the pipelined walk of the forward (softmax_forward_pipelined_kernel): a
// block holds its shares of y and dy as words, and loads its shares of the
// next row's while the row's dot product is in flight between the blocks.
// Against the launcher (a cluster per row, 512 threads of four packs) and a
// copy of the same traffic (y and dy read, dx written); dx checked against
// the launcher's.
// bash bench/micro/run.sh pipelined_softmax_backward
#include <cuda_bf16.h>

#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/rows.h"
#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T, int kPacks>
__global__ void __launch_bounds__(kRowThreadsMax)
    softmax_backward_pipelined(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx, int64_t rows,
                               int n, float scale) {
  constexpr int kVec = Vec16<T>::kSize;
  RowThreads<false> threads(rows);
  const int groups = n / kVec;
  const int64_t row_groups = gridDim.x / cluster_blocks();
  uint4 ys[kPacks], gs[kPacks], next_ys[kPacks], next_gs[kPacks];
  const auto load = [&](int64_t row, uint4(&y_words)[kPacks], uint4(&g_words)[kPacks]) {
    load_packs(threads, reinterpret_cast<const uint4*>(y + row * n), groups, y_words);
    load_packs(threads, reinterpret_cast<const uint4*>(dy + row * n), groups, g_words);
  };
  load(threads.row, ys, gs);
  for (;;) {
    asm volatile("" : "+r"(threads.rank), "+r"(threads.count));
    const int64_t row = threads.row, following = row + row_groups;
    float dot = 0;  // packs past the row are zeros
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += word_element<T>(ys[p], j) * word_element<T>(gs[p], j);
    dot = threads.template allreduce<SumOp<float>>(dot, [&] {
      if (following < rows) load(following, next_ys, next_gs);
    });
    uint4* const out = reinterpret_cast<uint4*>(dx + row * n);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (threads.group(p) >= groups) continue;
      float result[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        result[j] = scale * word_element<T>(ys[p], j) * (word_element<T>(gs[p], j) - dot);
      out[threads.group(p)] = words_of<T>(result);
    }
    if (following >= rows) break;
    threads.row = following;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) ys[p] = next_ys[p], gs[p] = next_gs[p];
  }
}

template <typename T, int kPacks>
void run(Timer& timer, const char* name, const T* dy, const T* y, T* dx, int64_t rows, int64_t n, float copy,
         float launcher, const std::vector<T>& launcher_dx) {
  constexpr int kVec = Vec16<T>::kSize;
  const auto kernel = softmax_backward_pipelined<T, kPacks>;
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
