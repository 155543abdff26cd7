// Times the softmax forward through its launcher (the kernel it picks for
// each width: warp rows, one block a row, a cluster of blocks, walking
// clusters) at 256-262144 wide (1000: odd rows, one element a load) against a
// copy of the same bytes, L2 evicted before each call. Build and run on the
// GPU machine: bash bench/micro/run.sh softmax_forward. NOTES.md keeps what
// it showed.
#include <cuda_bf16.h>

#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T>
void run(Timer& timer, int64_t rows, int64_t n, DType dtype, const char* dtype_name) {
  T *x, *y;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  const float copy = timer.copy_us(x, y, rows * n * int64_t(sizeof(T)));
  const SoftmaxShape shape{dtype, rows, n, /*causal=*/0, /*scale=*/1.0, "probe"};
  const SoftmaxForwardBuffers io{x, y};
  const float us = timer.median_us([&] { CHECK(softmax_forward(shape, io, nullptr)); });
  std::printf("| %s | (%lld, %lld) | %.1f | %.1f | %.2f |\n", dtype_name, (long long)rows, (long long)n, copy, us,
              copy / us);
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
}

int main() {
  Timer timer;
  const std::pair<int64_t, int64_t> shapes[] = {{65536, 256},   {16384, 2048},  {8192, 768},   {8192, 1000},
                                                {32768, 1024},  {8192, 1600},   {8192, 4096},  {4096, 8192},
                                                {8192, 16384},  {4096, 32768},  {2048, 65536}, {1024, 131072},
                                                {512, 262144}};
  std::printf("| dtype | shape | copy µs | forward µs | of copy |\n|---|---|---|---|---|\n");
  for (auto [rows, n] : shapes) run<__nv_bfloat16>(timer, rows, n, DType::BFloat16, "bfloat16");
  for (auto [rows, n] : shapes) run<float>(timer, rows, n, DType::Float, "float32");
  return 0;
}
