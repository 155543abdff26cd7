// What the kernel probes share: error checks, deterministic fills, a copy of
// the same bytes (the bandwidth ceiling), and a timer that evicts L2 by a
// read before each call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                             \
  do {                                                                          \
    cudaError_t err_ = (call);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

// The largest |a - b| between a device buffer and a host copy of the same
// length (outputs of two kernels that should agree).
template <typename T>
float largest_difference(const T* device, const std::vector<T>& host) {
  std::vector<T> copy(host.size());
  CHECK(cudaMemcpy(copy.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  float worst = 0;
  for (size_t i = 0; i < host.size(); ++i) worst = std::max(worst, std::fabs(float(copy[i]) - float(host[i])));
  return worst;
}

// The registers a thread of `kernel` takes.
template <typename Kernel>
int registers(Kernel kernel) {
  cudaFuncAttributes attributes;
  CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return attributes.numRegs;
}

// data[i] in [low, low + span), a hash of i and seed.
template <typename T>
__global__ void fill_uniform(T* data, int64_t n, uint32_t seed, float low, float span) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    data[i] = static_cast<T>(low + span * float(h % 20000) / 20000.0f);
  }
}

__global__ void read_all(const float4* data, int64_t count, float* sink) {
  float acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    acc += data[i].x;
  if (acc == 1234.5f) *sink = acc;
}

// One pack a thread, one pass: on the H200 as fast as cudaMemcpyAsync (126
// µs for 256 MiB), where a grid-stride loop over 528 blocks took 135
// (stream_shapes.cu).
__global__ void copy_all(const float4* in, float4* out, int64_t count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = in[i];
}

// Median µs of launch() over `reps` calls, each after a 256 MiB read.
struct Timer {
  float4* flush;
  float* sink;
  int64_t flush_count = (256ll << 20) / 16;
  Timer() {
    CHECK(cudaMalloc(&flush, flush_count * 16));
    CHECK(cudaMemset(flush, 0, flush_count * 16));
    CHECK(cudaMalloc(&sink, 4));
  }
  template <typename F>
  float median_us(F&& launch, int reps = 15) {
    launch();
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    std::vector<float> times;
    for (int r = 0; r < reps; ++r) {
      read_all<<<132 * 8, 512>>>(flush, flush_count, sink);
      CHECK(cudaEventRecord(begin));
      launch();
      CHECK(cudaEventRecord(end));
      CHECK(cudaEventSynchronize(end));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, begin, end));
      times.push_back(ms * 1e3f);
    }
    CHECK(cudaGetLastError());
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
  // A copy of `bytes` (a multiple of 16) from `in` to `out`: the two passes' limit.
  float copy_us(const void* in, void* out, int64_t bytes) {
    return median_us([&] {
      const int64_t count = bytes / 16;
      copy_all<<<(count + 255) / 256, 256>>>(static_cast<const float4*>(in), static_cast<float4*>(out), count);
    });
  }
};
