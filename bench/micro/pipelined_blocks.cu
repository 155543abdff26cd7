// The blocks of the pipelined walks (softmax forward, cross-entropy with its
// gradient, the layer_norm and rms_norm forwards) at rows past 8 blocks of
// 256 threads: each kernel in 16 blocks of 256 or 8 of 512, at 4, 5, 6 and 8
// packs a thread where those hold the row (and float rows past 131072 in 16
// of 512), then the launchers, against a copy of the same bytes. Prints µs
// and the clusters resident at once.
//   bash bench/micro/run.sh pipelined_blocks
// H200 (NOTES, 2026-12-04): 8 blocks of 512 ahead of 16 of 256 at every
// two-byte width here but layer_norm's 262144 (1-2% behind), and 5 packs
// ahead of 8 where they hold the row (cross-entropy bf16 (4096, 151936) 808
// -> 765 -> 719 µs, softmax 755 -> 649 -> 639, rms_norm 742 -> 626 -> 623);
// float rows at 5 packs fastest in 16 blocks of 256 but for cross-entropy's
// (layer_norm float32 (4096, 80000) 659 there, 753 in 8 of 512); past 16
// blocks of 256, 16 of 512 ahead of the launchers' other kernels or within
// 0.6% (bf16 (1024, 524288): cross-entropy 747 -> 558, layer_norm 822 ->
// 533).
// Then rows whose packs filled the launchers' blocks poorly (bf16 50304: 6288
// packs in 8 blocks of 128 at 8 packs, 8192 slots), in the fewest threads
// that hold the row in each cluster of 2-16 blocks at 4-8 packs (H200,
// NOTES 2026-12-05: 5 packs ahead at two bytes where they keep as many
// clusters resident; rows.h's launch_pipelined_rows).
//   bash bench/micro/run.sh pipelined_blocks eight
// times the launchers' two-byte rows of 8 blocks against the 8 packs a
// thread that they took before fewer_packs_threads.
#include <cuda_bf16.h>

#include <string>
#include <vector>

#include "../../csrc/kernels/cross_entropy_kernels.cuh"
#include "../../csrc/kernels/norm_kernels.cuh"
#include "../../csrc/kernels/softmax_kernels.cuh"
#include "../../csrc/launch/cross_entropy.h"
#include "../../csrc/launch/norms.h"
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
  const T* weight;
  const T* bias;
  float* mean;  // and the rows' rstd: lse
};

// The norm forward's pipelined kernel's clusters resident at once.
template <typename T, int kPacks, typename Math>
int norm_resident(int threads, int cluster) {
  const size_t shared = kWalkSlotBytes<T, Vec16<T>::kSize, Math> * kPacks * threads;
  return rows::resident_clusters(norm_forward_pipelined_kernel<T, kPacks, Math>, cluster, threads, shared);
}

// The norm forward's pipelined kernel in `cluster` blocks of `threads`: µs.
template <typename T, int kPacks, typename Math>
float time_norm(Timer& timer, const Case<T>& c, int threads, int cluster) {
  constexpr int kVec = Vec16<T>::kSize;
  const auto kernel = norm_forward_pipelined_kernel<T, kPacks, Math>;
  const size_t shared = kWalkSlotBytes<T, kVec, Math> * kPacks * threads;
  const int resident = norm_resident<T, kPacks, Math>(threads, cluster);
  if (resident == 0) return 0.f;
  NormForwardArgs<T> a{};
  a.x = c.x, a.y = c.y, a.weight = c.weight, a.bias = Math::kCentered ? c.bias : nullptr;
  a.mean = Math::kCentered ? c.mean : nullptr, a.rstd = c.lse, a.rows = c.rows, a.n = c.n, a.eps = 1e-5f;
  return timer.median_us([&] {
    CHECK(rows::launch_clusters(kernel, std::min<int64_t>(c.rows, resident), cluster, threads, shared, nullptr,
                                std::make_tuple(a)));
  });
}

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
  const float layer_us = time_norm<T, kPacks, LayerNormMath>(timer, c, threads, cluster);
  const float rms_us = time_norm<T, kPacks, RmsNormMath>(timer, c, threads, cluster);
  std::printf("| | %d x %d, %d packs (fill %.2f; norms' clusters at once %d, %d) | %d | %.1f | %d | %.1f | %.1f | "
              "%.1f |\n",
              cluster, threads, kPacks, double(c.n) / (double(threads) * cluster * kPacks * kVec),
              norm_resident<T, kPacks, LayerNormMath>(threads, cluster),
              norm_resident<T, kPacks, RmsNormMath>(threads, cluster), ce_resident, ce_us, sm_resident, sm_us,
              layer_us, rms_us);
}

// The fewest threads, a multiple of a warp, that hold the row in each
// cluster at kPacks packs a thread.
template <typename T, int kPacks>
void fewest_threads(Timer& timer, const Case<T>& c) {
  const int64_t groups = c.n / Vec16<T>::kSize;
  for (int cluster = 2; cluster <= kClusterBlocksMax; cluster *= 2) {
    const int64_t threads = rows::fewest_threads_holding(groups, cluster, kPacks);
    if (threads >= 2 * kWarpSize && threads <= kRowThreadsMax)
      blocks<T, kPacks>(timer, c, int(threads), cluster);
  }
}

// What shape() times besides the launchers: 16 x 256 and 8 x 512 at 4-8
// packs; the fewest threads at 4-8 packs in each cluster; or the blocks of
// 8 at 8 packs that two-byte rows took before fewer_packs_threads, and the
// fewest warps at 5 packs.
enum class Sweep { kWideBlocks, kFill, kEightPacks };

template <typename T>
void shape(Timer& timer, DType dtype, const char* name, int64_t rows, int64_t n, Sweep sweep = Sweep::kWideBlocks) {
  Case<T> c{nullptr, nullptr, nullptr, nullptr, rows, n, nullptr, nullptr, nullptr};
  T *x, *y, *weight, *bias;
  int64_t* target;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&weight, n * sizeof(T)));
  CHECK(cudaMalloc(&bias, n * sizeof(T)));
  CHECK(cudaMalloc(&target, rows * 8));
  CHECK(cudaMalloc(&c.lse, rows * 4));
  CHECK(cudaMalloc(&c.mean, rows * 4));
  c.x = x, c.y = y, c.target = target, c.weight = weight, c.bias = bias;
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  fill_uniform<<<64, 256>>>(weight, n, 2u, 0.5f, 1.5f);
  fill_uniform<<<64, 256>>>(bias, n, 3u, -1.0f, 1.0f);
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
  const auto norm_us = [&](NormKind kind) {
    const bool centered = kind == NormKind::Layer;
    const NormShape norm{dtype, rows, n, kind, "probe"};
    const NormForwardBuffers<> io{x, nullptr, weight, centered ? bias : nullptr, y, nullptr,
                                  centered ? c.mean : nullptr, c.lse};
    return timer.median_us([&] { CHECK(norm_forward(norm, io, 1e-5, nullptr)); });
  };
  std::printf("| %s (%lld, %lld), copy %.1f | launchers | | %.1f | | %.1f | %.1f | %.1f |\n", name,
              (long long)rows, (long long)n, copy, ce_us, sm_us, norm_us(NormKind::Layer), norm_us(NormKind::Rms));
  if (sweep == Sweep::kEightPacks) {
    const int64_t groups = n / Vec16<T>::kSize;
    if (const rows::PipelinedBlocks eight = rows::pipelined_blocks_of<T>(groups);
        eight.cluster == rows::kPipelinedBlocksMin) {
      blocks<T, 8>(timer, c, eight.threads, eight.cluster);
      blocks<T, 5>(timer, c, int(rows::fewest_threads_holding(groups, eight.cluster, rows::kFewerPipelinedPacks)),
                   eight.cluster);
    }
  } else if (sweep == Sweep::kFill) {
    fewest_threads<T, 4>(timer, c);
    fewest_threads<T, 5>(timer, c);
    fewest_threads<T, 6>(timer, c);
    fewest_threads<T, 7>(timer, c);
    fewest_threads<T, 8>(timer, c);
  } else {
  for (auto [threads, cluster] : {std::pair<int, int>{256, 16}, {512, 8}}) {
    blocks<T, 4>(timer, c, threads, cluster);
    blocks<T, 5>(timer, c, threads, cluster);
    blocks<T, 6>(timer, c, threads, cluster);
    blocks<T, 8>(timer, c, threads, cluster);
  }
  // Rows past 16 blocks of 256 at 8 packs: 16 blocks of 512 (the launchers
  // take other kernels there).
  if (n > int64_t(16) * rows::kPipelinedThreads * rows::kPipelinedPacks * Vec16<T>::kSize)
    blocks<T, 8>(timer, c, 512, 16);
  }
  for (void* p : {(void*)x, (void*)y, (void*)weight, (void*)bias, (void*)target, (void*)c.lse, (void*)c.mean})
    CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
  Timer timer;
  std::printf("| shape | blocks | cross-entropy clusters at once | cross-entropy µs | softmax clusters at once | "
              "softmax µs | layer_norm µs | rms_norm µs |\n|---|---|---|---|---|---|---|---|\n");
  if (argc > 1 && std::string(argv[1]) == "eight") {  // the launchers against the 8 packs they took before
    for (int64_t n : {20000, 24576, 32768, 40000, 45000, 50304, 57344, 65536, 80000, 100352, 110000, 128256})
      shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", (int64_t(400) << 20) / (2 * n), n, Sweep::kEightPacks);
    return 0;
  }
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 151936}, {4096, 163840}, {4096, 200064}, {1024, 262144},
                                                       {512, 262144}, {1024, 524288}})
    shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", rows, n);
  for (auto [rows, n] :
       {std::pair<int64_t, int64_t>{4096, 80000}, {2048, 100000}, {1024, 131072}, {2048, 256000}, {2048, 262144},
        {512, 262144}})
    shape<float>(timer, DType::Float, "float32", rows, n);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 50304}, {4096, 100352}, {4096, 128256}, {8192, 24576}})
    shape<__nv_bfloat16>(timer, DType::BFloat16, "bfloat16", rows, n, Sweep::kFill);
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 50304}, {4096, 128256}, {8192, 24576}})
    shape<float>(timer, DType::Float, "float32", rows, n, Sweep::kFill);
  return 0;
}
