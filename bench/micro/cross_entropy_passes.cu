// Times cross-entropy's loss with its gradient alone: the launcher's choice
// (the pipelined kernel for rows past one block: pipelined_blocks.cu times
// its blocks), and the shared-memory kernel over its launch shapes
// (threads, blocks per SM, bytes of the row kept in shared memory), against
// the separate forward and backward kernels (three passes over the logits)
// and a copy of the logits (the two passes' limit), L2 evicted before each
// call. Checks each shape's lse and gradient against the separate kernels.
// Build and run on the GPU machine: bash bench/micro/run.sh cross_entropy.
// NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include <cstdlib>
#include <functional>
#include <iterator>
#include <string>

#include "../../csrc/kernels/cross_entropy_kernels.cuh"
#include "../../csrc/launch/cross_entropy.h"
#include "../../csrc/launch/rows.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T>
__global__ void max_difference(const T* a, const T* b, int64_t n, float* out) {
  float worst = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    worst = fmaxf(worst, fabsf(static_cast<float>(a[i]) - static_cast<float>(b[i])));
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(worst));
}

template <typename T>
void run_shape(Timer& timer, int64_t rows, int64_t classes, const char* name, int sms) {
  using A = opmath_t<T>;
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n = rows * classes;
  const double bytes = double(n) * sizeof(T);
  T *logits, *grad, *reference;
  int64_t* target;
  A *lse, *lse_ref, *row_loss, *one;
  float* worst;
  CHECK(cudaMalloc(&logits, n * sizeof(T)));
  CHECK(cudaMalloc(&grad, n * sizeof(T)));
  CHECK(cudaMalloc(&reference, n * sizeof(T)));
  CHECK(cudaMalloc(&target, rows * 8));
  CHECK(cudaMalloc(&lse, rows * sizeof(A)));
  CHECK(cudaMalloc(&lse_ref, rows * sizeof(A)));
  CHECK(cudaMalloc(&row_loss, rows * sizeof(A)));
  CHECK(cudaMalloc(&one, sizeof(A)));
  CHECK(cudaMalloc(&worst, 4));
  fill_uniform<<<1024, 256>>>(logits, n, 7u, -4.0f, 8.0f);
  std::vector<int64_t> host_target(rows);
  for (int64_t r = 0; r < rows; ++r) host_target[r] = (r * 7919) % classes;
  host_target[0] = -100;
  CHECK(cudaMemcpy(target, host_target.data(), rows * 8, cudaMemcpyHostToDevice));
  const A host_one = 1;
  CHECK(cudaMemcpy(one, &host_one, sizeof(A), cudaMemcpyHostToDevice));
  // Rows of whole packs (every shape here is), one after another.
  const CrossEntropyArgs<T> a{logits, target, rows, classes, classes, -100, A(0), classes / kVec};

  std::printf("\n### %s (%lld, %lld): %.0f MiB of logits\n\n", name, (long long)rows, (long long)classes,
              bytes / (1 << 20));
  std::printf("| kernel | threads | blocks/SM | cached KiB | µs | GB/s (2 passes) | max |grad diff| |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const float copy = timer.copy_us(logits, grad, int64_t(bytes));
  std::printf("| copy (the limit) | 512 | 4 | 0 | %.1f | %.0f | |\n", copy, 2 * bytes / copy / 1e3);
  const float three = timer.median_us([&] {
    cross_entropy_forward_kernel<T, kVec><<<rows, kCrossEntropyThreads>>>(a, lse_ref, row_loss);
    cross_entropy_backward_kernel<T, kVec><<<rows, kCrossEntropyThreads>>>(a, nullptr, one, nullptr, lse_ref, reference);
  });
  std::printf("| forward + backward | 256 | rows | 0 | %.1f | %.0f | 0 |\n", three, 2 * bytes / three / 1e3);

  const CrossEntropyShape shape{std::is_same_v<T, float> ? DType::Float : DType::BFloat16, rows, classes, classes, -100, 0.0, 2,
                                "cross_entropy"};
  const CrossEntropyWithGradBuffers io{logits, target, nullptr, lse, row_loss, nullptr, grad};
  const float chosen = timer.median_us([&] { CHECK(cross_entropy_forward_backward(shape, io, nullptr, sms, 0)); });
  CHECK(cudaMemset(worst, 0, 4));
  max_difference<<<1024, 256>>>(grad, reference, n, worst);
  max_difference<<<1, 256>>>(lse, lse_ref, rows, worst);
  float chosen_worst = 0;
  CHECK(cudaMemcpy(&chosen_worst, worst, 4, cudaMemcpyDeviceToHost));
  std::printf("| with gradient, the launcher's choice | | | | %.1f | %.0f | %.3g |\n", chosen, 2 * bytes / chosen / 1e3,
              chosen_worst);
  // reduction mean, as F.cross_entropy's default: the kernel also counts the rows not ignored.
  CrossEntropyShape mean_shape = shape;
  mean_shape.reduction = 1;
  const float mean_us = timer.median_us([&] { CHECK(cross_entropy_forward_backward(mean_shape, io, nullptr, sms, 0)); });
  std::printf("| with gradient, mean, the launcher's choice | | | | %.1f | %.0f | |\n", mean_us, 2 * bytes / mean_us / 1e3);

  auto kernel = cross_entropy_forward_backward_kernel<T, kVec, false>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  struct Config {
    int threads, per_sm, cached_kib;
    bool prefetch;
  };
  const Config configs[] = {{256, 0, 0, false},  {512, 2, 0, false},    {512, 2, 100, false}, {512, 2, 100, true},
                            {384, 3, 70, true},  {1024, 1, 0, false},   {1024, 1, 200, false}, {1024, 1, 200, true}};
  for (const Config& c : configs) {
    const int64_t blocks = c.per_sm == 0 ? rows : std::min<int64_t>(rows, int64_t(sms) * c.per_sm);
    const int64_t cached = std::min<int64_t>(c.cached_kib * 1024 / 16, classes / kVec);
    const size_t shared = cached * 16;
    const float us = timer.median_us([&] {
      kernel<<<blocks, c.threads, shared>>>(a, nullptr, false, lse, row_loss, LossFold<T>{}, grad, cached, c.prefetch);
    });
    CHECK(cudaMemset(worst, 0, 4));
    max_difference<<<1024, 256>>>(grad, reference, n, worst);
    max_difference<<<1, 256>>>(lse, lse_ref, rows, worst);
    float host_worst = 0;
    CHECK(cudaMemcpy(&host_worst, worst, 4, cudaMemcpyDeviceToHost));
    std::printf("| with gradient%s | %d | %s | %lld | %.1f | %.0f | %.3g |\n", c.prefetch ? ", prefetch" : "",
                c.threads, c.per_sm == 0 ? "rows" : std::to_string(c.per_sm).c_str(), (long long)(shared / 1024), us,
                2 * bytes / us / 1e3, host_worst);
  }
  // The row split over a cluster of 2 to 16 blocks of 256 threads (the kSplit
  // kernel; 512 threads lost at every shape on the H200), as many clusters as
  // fit at once, each block caching its share whole.
  if constexpr (std::is_same_v<A, float>) {
    auto split = cross_entropy_forward_backward_kernel<T, kVec, true>;
    constexpr int threads = 256;
    for (int cluster = 2; cluster <= kClusterBlocksMax; cluster *= 2) {
      const int64_t share = (classes / kVec + cluster - 1) / cluster;
      const size_t shared = size_t(share) * 16;
      if (shared > 200 * 1024) continue;
      CHECK(rows::allow_clusters(split, cluster, shared));
      const int resident = rows::resident_clusters(split, cluster, threads, shared);
      if (resident == 0) continue;
      cudaLaunchAttribute attribute = rows::cluster_attribute(cluster);
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(std::min<int64_t>(rows, resident) * cluster));
      config.blockDim = dim3(unsigned(threads));
      config.dynamicSmemBytes = shared;
      config.attrs = &attribute;
      config.numAttrs = 1;
      const float us = timer.median_us([&] {
        CHECK(cudaLaunchKernelEx(&config, split, a, static_cast<const A*>(nullptr), false, lse, row_loss,
                                 LossFold<T>{}, grad, share, true));
      });
      CHECK(cudaMemset(worst, 0, 4));
      max_difference<<<1024, 256>>>(grad, reference, n, worst);
      max_difference<<<1, 256>>>(lse, lse_ref, rows, worst);
      float host_worst = 0;
      CHECK(cudaMemcpy(&host_worst, worst, 4, cudaMemcpyDeviceToHost));
      std::printf("| with gradient, split over %d, %d clusters | %d | | %lld | %.1f | %.0f | %.3g |\n", cluster,
                  resident, threads, (long long)(shared / 1024), us, 2 * bytes / us / 1e3, host_worst);
    }
  }
  for (void* p : {(void*)logits, (void*)grad, (void*)reference, (void*)target, (void*)lse, (void*)lse_ref,
                  (void*)row_loss, (void*)one, (void*)worst})
    CHECK(cudaFree(p));
}

// An argument N runs the first N shapes only (an A/B inside a short call).
int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Timer timer;
  const std::function<void()> shapes[] = {
      [&] { run_shape<__nv_bfloat16>(timer, 4096, 128256, "bfloat16", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 8192, 50304, "bfloat16", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 1024, 262144, "bfloat16", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 8192, 32000, "bfloat16", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 4096, 151936, "bfloat16", sms); },
      [&] { run_shape<float>(timer, 4096, 128256, "float32", sms); },
      [&] { run_shape<float>(timer, 8192, 50304, "float32", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 8192, 20480, "bfloat16", sms); },
      [&] { run_shape<__nv_bfloat16>(timer, 4096, 200064, "bfloat16", sms); },
      [&] { run_shape<float>(timer, 4096, 151936, "float32", sms); },
  };
  const int count = argc > 1 ? std::atoi(argv[1]) : int(std::size(shapes));
  for (int i = 0; i < count && i < int(std::size(shapes)); ++i) shapes[i]();
  return 0;
}
