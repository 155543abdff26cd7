// Times the block-per-row norm forward (the row in registers) on wide rows
// alone, L2 evicted before each call, against a copy of the same bytes, at
// two and four packs per thread. Build and run on the GPU machine:
// bash bench/micro/run.sh wide_rows. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../../csrc/kernels/norm_kernels.cuh"

using namespace fastreduce;

#define CHECK(call)                                                             \
  do {                                                                          \
    cudaError_t err_ = (call);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

template <typename T>
__global__ void fill(T* data, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    data[i] = static_cast<T>(float(h % 20000) / 10000.0f - 0.5f);
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

template <typename F>
float median_us(F&& launch, const float4* flush, int64_t flush_count, float* sink, int reps = 30) {
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

template <typename T, typename Math>
void run(int64_t rows, int64_t n, const char* dtype, float4* flush, int64_t flush_count, float* sink) {
  using A = opmath_t<T>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr bool kCentered = Math::kCentered;
  T *x, *y, *w, *b;
  A *mean, *rstd;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&w, n * sizeof(T)));
  CHECK(cudaMalloc(&b, n * sizeof(T)));
  CHECK(cudaMalloc(&mean, rows * sizeof(A)));
  CHECK(cudaMalloc(&rstd, rows * sizeof(A)));
  fill<<<1024, 256>>>(x, rows * n, 1u);
  fill<<<64, 256>>>(w, n, 2u);
  fill<<<64, 256>>>(b, n, 3u);
  NormForwardArgs<T> a{};
  a.x = x, a.weight = w, a.bias = kCentered ? b : nullptr, a.y = y, a.mean = mean, a.rstd = rstd;
  a.rows = rows, a.n = n, a.eps = A(1e-5);
  const float copy = median_us([&] { copy_all<<<132 * 4, 512>>>(reinterpret_cast<const float4*>(x),
                                                                 reinterpret_cast<float4*>(y),
                                                                 int64_t(rows * n * sizeof(T) / 16)); },
                               flush, flush_count, sink);
  const int groups = int(n / kVec);
  auto time = [&](auto kernel, int packs) {
    const int threads = (groups + packs - 1) / packs;
    if (threads > kRowThreadsMax) return -1.0f;  // beyond the kernel's launch bound
    return median_us([&] { kernel<<<rows, threads>>>(a); }, flush, flush_count, sink);
  };
  const float four = time(norm_forward_lanes_kernel<T, 4, kVec, false, Math>, 4);
  const float two = time(norm_forward_lanes_kernel<T, 2, kVec, false, Math>, 2);
  std::printf("| %s | %s | (%lld, %lld) | %.1f | %.1f | %.1f |\n", kCentered ? "layer_norm" : "rms_norm", dtype,
              (long long)rows, (long long)n, copy, four, two);
  for (void* p : {(void*)x, (void*)y, (void*)w, (void*)b, (void*)mean, (void*)rstd}) CHECK(cudaFree(p));
}

int main() {
  float4* flush;
  float* sink;
  const int64_t flush_count = (256ll << 20) / 16;
  CHECK(cudaMalloc(&flush, flush_count * 16));
  CHECK(cudaMemset(flush, 0, flush_count * 16));
  CHECK(cudaMalloc(&sink, 4));
  std::printf("| norm | dtype | shape | copy µs | 4 packs a thread µs | 2 packs µs |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 8192}, {2048, 16384}}) {
    run<__nv_bfloat16, LayerNormMath>(rows, n, "bfloat16", flush, flush_count, sink);
    run<__nv_bfloat16, RmsNormMath>(rows, n, "bfloat16", flush, flush_count, sink);
    if (n <= 8192) {
      run<float, LayerNormMath>(rows, n, "float32", flush, flush_count, sink);
      run<float, RmsNormMath>(rows, n, "float32", flush, flush_count, sink);
    }
  }
  return 0;
}
