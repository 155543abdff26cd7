// Times the warp-per-row norm kernels alone (no torch, no launch glue), L2
// evicted by a read before each call, against a copy of the same bytes: the
// float layer_norm forward in registers against staged in shared memory, for a
// register budget given at build time (nvcc -maxrregcount), and the fused
// layer_norm backward at 1-4 blocks per SM. Build and run on the GPU machine:
// bash bench/micro/run.sh. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../../csrc/kernels/norm_kernels.cuh"

using namespace fastreduce;

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess) {                                                            \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));           \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

template <typename T>
__global__ void fill_random(T* data, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    data[i] = static_cast<T>(float(h % 20000) / 10000.0f - 1.0f);
  }
}

__global__ void read_all(const float4* data, int64_t count, float* sink) {
  float acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    acc += data[i].x;
  if (acc == 1234.5f) *sink = acc;
}

__global__ void copy_all(const float4* in, float4* out, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

struct Bench {
  float4* flush;
  float* sink;
  int64_t flush_count = (256ll << 20) / 16;
  Bench() {
    CHECK(cudaMalloc(&flush, flush_count * 16));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(flush, 0, flush_count * 16));
  }
  template <typename F>
  float median_us(F&& launch, int reps = 50) {
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    std::vector<float> times;
    for (int i = 0; i < reps + 3; ++i) {
      read_all<<<132 * 4, 512>>>(flush, flush_count, sink);
      CHECK(cudaEventRecord(begin));
      launch();
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(end));
      CHECK(cudaEventSynchronize(end));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, begin, end));
      if (i >= 3) times.push_back(ms * 1000);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
};

template <typename K>
void report(const char* name, K kernel, int threads, size_t shared, float us, double bytes) {
  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared));
  std::printf("| %s | %d | %d | %zu | %.2f | %.0f |\n", name, attr.numRegs, blocks * threads / 32,
              attr.localSizeBytes, us, bytes / us / 1e3);
}

int main() {
  Bench bench;
  std::printf("| case | registers | warps/SM | local bytes | µs | GB/s |\n|---|---|---|---|---|---|\n");
  {  // layer_norm (8192, 768) float32
    const int64_t rows = 8192, n = 768;
    float *x, *y, *w, *b, *dy, *dx, *mean, *rstd, *pw, *pb;
    CHECK(cudaMalloc(&x, rows * n * 4));
    CHECK(cudaMalloc(&y, rows * n * 4));
    CHECK(cudaMalloc(&dy, rows * n * 4));
    CHECK(cudaMalloc(&dx, rows * n * 4));
    CHECK(cudaMalloc(&w, n * 4));
    CHECK(cudaMalloc(&b, n * 4));
    CHECK(cudaMalloc(&mean, rows * 4));
    CHECK(cudaMalloc(&rstd, rows * 4));
    CHECK(cudaMalloc(&pw, 132 * 8 * n * 4));
    CHECK(cudaMalloc(&pb, 132 * 8 * n * 4));
    fill_random<<<1024, 256>>>(x, rows * n, 1);
    fill_random<<<1024, 256>>>(dy, rows * n, 2);
    fill_random<<<8, 256>>>(w, n, 3);
    fill_random<<<8, 256>>>(b, n, 4);
    const int64_t blocks = (rows + 7) / 8;
    auto forward = layer_norm_forward_lanes_kernel<float, 6, 4, true>;
    float us = bench.median_us([&] { forward<<<rows / 4, 128>>>(x, w, b, y, mean, rstd, rows, int(n), 1e-5f); });
    report("layer_norm fwd f32 8192x768, row in registers", forward, 128, 0, us, 2.0 * rows * n * 4);
    auto staged = layer_norm_forward_warp_kernel<float, 4>;
    us = bench.median_us([&] { staged<<<blocks, 256, 8 * n * 4>>>(x, w, b, y, mean, rstd, rows, int(n), 1e-5f); });
    report("layer_norm fwd f32 8192x768, row staged", staged, 256, 8 * n * 4, us, 2.0 * rows * n * 4);
    auto per_row = layer_norm_forward_kernel<float>;
    for (int threads : {64, 128, 256}) {
      us = bench.median_us([&] { per_row<<<rows, threads, n * 4>>>(x, w, b, y, mean, rstd, n, 1e-5f, true); });
      char name[64];
      std::snprintf(name, sizeof name, "layer_norm fwd f32 8192x768, block per row, %d threads", threads);
      report(name, per_row, threads, n * 4, us, 2.0 * rows * n * 4);
    }
    us = bench.median_us([&] {
      copy_all<<<132 * 4, 512>>>(reinterpret_cast<float4*>(x), reinterpret_cast<float4*>(y), rows * n / 4);
    });
    std::printf("| copy 25 MB | | | | %.2f | %.0f |\n", us, 2.0 * rows * n * 4 / us / 1e3);

    auto backward = layer_norm_backward_lanes_kernel<float, 6, 4, true>;
    const size_t shared = 2 * 8 * n * 4;
    CHECK(cudaFuncSetAttribute(backward, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    for (int per_sm : {1, 2, 3, 4}) {
      const int64_t per_warp = (rows + 132 * per_sm * 8 - 1) / (132 * per_sm * 8);
      us = bench.median_us([&] {
        backward<<<132 * per_sm, 256, shared>>>(dy, x, mean, rstd, w, dx, pw, pb, rows, int(n), per_warp);
      });
      char name[64];
      std::snprintf(name, sizeof name, "layer_norm bwd fused f32 8192x768, %d blocks/SM", per_sm);
      report(name, backward, 256, shared, us, 3.0 * rows * n * 4);
    }
    us = bench.median_us(
        [&] { backward<<<blocks, 256>>>(dy, x, mean, rstd, w, dx, nullptr, nullptr, rows, int(n), 1); });
    report("layer_norm bwd dx only f32 8192x768", backward, 256, 0, us, 3.0 * rows * n * 4);
  }
  {  // softmax (98304, 1024) bfloat16
    const int64_t rows = 98304, n = 1024;
    __nv_bfloat16 *x, *y;
    CHECK(cudaMalloc(&x, rows * n * 2));
    CHECK(cudaMalloc(&y, rows * n * 2));
    fill_random<<<1024, 256>>>(x, rows * n, 5);
    auto softmax = softmax_forward_warp_kernel<__nv_bfloat16, 8>;
    float us = bench.median_us([&] { softmax<<<rows / 8, 256, 8 * n * 2>>>(x, y, rows, int(n), 0, 1.0f); });
    report("softmax bf16 98304x1024", softmax, 256, 8 * n * 2, us, 2.0 * rows * n * 2);
    us = bench.median_us([&] {
      copy_all<<<132 * 4, 512>>>(reinterpret_cast<float4*>(x), reinterpret_cast<float4*>(y), rows * n / 8);
    });
    std::printf("| copy 201 MB | | | | %.2f | %.0f |\n", us, 2.0 * rows * n * 2 / us / 1e3);
  }
  return 0;
}
