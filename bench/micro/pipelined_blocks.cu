// The blocks of the pipelined walks (softmax forward, cross-entropy with its
// gradient) at rows past 8 blocks of 256 threads: each kernel in 16 blocks
// of 256 or 8 of 512, at 4, 5, 6 and 8 packs a thread where those hold the
// row, then both launchers (rows.h's pipelined_launch_of), against a copy of
// the same bytes. Prints µs and the clusters resident at once.
//   bash bench/micro/run.sh pipelined_blocks
// H200 (NOTES, 2026-12-04): 8 blocks of 512 ahead of 16 of 256 at every
// two-byte width here, and 5 packs ahead of 8 where they hold the row
// (cross-entropy bf16 (4096, 151936) 813 -> 766 -> 724 µs, softmax 758 ->
// 715 -> 645); float32 softmax (1024, 131072) 265 -> 274 at 8 packs.
#include <cuda_bf16.h>

#include <vector>

#include "../../csrc/kernels/cross_entropy_kernels.cuh"
#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/cross_entropy.h"
#include "../../csrc/launch/rows.h"
#include "../../csrc/launch/softmax.h"
#include "probe.cuh"

using namespace fastreduce;

template <typename T>
struct Case {
  const T* x;
  T* y;
  const int64_t* target;
  float* lse;
  int64_t rows, n;
};

template <typename T, int kPacks>
void blocks(Timer& timer, const Case<T>& c, int threads, int cluster) {
  constexpr int kVec = Vec16<T>::kSize;
  if (int64_t(threads) * cluster * kPacks * kVec < c.n) return;  // does not hold the row
  const CrossEntropyArgs<T> a{c.x, c.target, c.rows, c.n, c.n, -100, 0.0f, c.n / kVec};
  const auto ce = cross_entropy_forward_backward_pipelined_kernel<T, kPacks, false>;
  const auto sm = softmax_forward_pipelined_kernel<T, kPacks, false>;
  const int ce_resident = rows::resident_clusters(ce, cluster, threads, 0);
  const int sm_resident = rows::resident_clusters(sm, cluster, threads, 0);
  const auto ce_args = std::make_tuple(a, static_cast<const float*>(nullptr), true, c.lse, static_cast<float*>(nullptr),
                                       LossFold<T>{}, c.y);
  const float ce_us = ce_resident == 0 ? 0.f : timer.median_us([&] {
    CHECK(rows::launch_clusters(ce, std::min<int64_t>(c.rows, ce_resident), cluster, threads, 0, nullptr, ce_args));
  });
  const float sm_us = sm_resident == 0 ? 0.f : timer.median_us([&] {
    CHECK(rows::launch_clusters(sm, std::min<int64_t>(c.rows, sm_resident), cluster, threads, 0, nullptr,
                                std::make_tuple(c.x, c.y, c.rows, int(c.n), 1.0f)));
  });
  std::printf("| | %d x %d, %d packs | %d | %.1f | %d | %.1f |\n", cluster, threads, kPacks, ce_resident, ce_us,
              sm_resident, sm_us);
}

template <typename T>
void shape(Timer& timer, DType dtype, const char* name, int64_t rows, int64_t n) {
  Case<T> c{nullptr, nullptr, nullptr, nullptr, rows, n};
  T *x, *y;
  int64_t* target;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&target, rows * 8));
  CHECK(cudaMalloc(&c.lse, rows * 4));
  c.x = x, c.y = y, c.target = target;
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  std::vector<int64_t> host_target(rows);
  for (int64_t r = 0; r < rows; ++r) host_target[r] = (r * 7919) % n;
  CHECK(cudaMemcpy(target, host_target.data(), rows * 8, cudaMemcpyHostToDevice));
  const float copy = timer.copy_us(x, y, rows * n * int64_t(sizeof(T)));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const CrossEntropyShape ce{dtype, rows, n, n, -100, 0.0, 1, "probe"};
  const CrossEntropyWithGradBuffers ce_io{x, target, nullptr, c.lse, nullptr, nullptr, y};
  const float ce_us = timer.median_us([&] { CHECK(cross_entropy_forward_backward(ce, ce_io, nullptr, sms, 0)); });
  const SoftmaxShape sm{dtype, rows, n, 0, 1.0, "probe"};
  const SoftmaxForwardBuffers sm_io{x, y};
  const float sm_us = timer.median_us([&] { CHECK(softmax_forward(sm, sm_io, nullptr)); });
  std::printf("| %s (%lld, %lld), copy %.1f | launchers | | %.1f | | %.1f |\n", name, (long long)rows,
              (long long)n, copy, ce_us, sm_us);
  for (auto [threads, cluster] : {std::pair<int, int>{256, 16}, {512, 8}}) {
    blocks<T, 4>(timer, c, threads, cluster);
    blocks<T, 5>(timer, c, threads, cluster);
    blocks<T, 6>(timer, c, threads, cluster);
    blocks<T, 8>(timer, c, threads, cluster);
  }
  for (void* p : {(void*)x, (void*)y, (void*)target, (void*)c.lse}) CHECK(cudaFree(p));
}

int main() {
  Timer timer;
  std::printf("| shape | blocks | cross-entropy clusters at once | cross-entropy µs | softmax clusters at once | "
              "softmax µs |\n|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 151936}, {4096, 163840}, {4096, 200064}, {1024, 262144}})
    shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", rows, n);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 80000}, {2048, 100000}, {1024, 131072}})
    shape<float>(timer, DType::Float, "float32", rows, n);
  return 0;
}
