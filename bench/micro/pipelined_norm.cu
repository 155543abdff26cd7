// The norm forwards of wide rows split over clusters: the launcher against
// norm_forward_pipelined_kernel (4 or 8 packs a thread held as words, the
// next row loaded during the exchange) in each block size and cluster (one
// block included: a walk without a cluster) that holds the row exactly, bf16
// and float32, weight and bias as bench/peers.py's cells, against a copy of
// the same bytes; y checked against the launcher's.
// bash bench/micro/run.sh pipelined_norm
#include <cuda_bf16.h>

#include <vector>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math, int kPacks>
void run(Timer& timer, const char* name, const NormForwardArgs<T>& a, int64_t rows, int64_t n, size_t bytes,
         float copy, float launcher, const std::vector<T>& launcher_y) {
  constexpr int kVec = Vec16<T>::kSize;
  const auto kernel = norm_forward_pipelined_kernel<T, kPacks, Math>;
  const size_t slot_bytes = kWalkSlotBytes<T, kVec, Math>;
  for (int threads : {64, 128, 256, 512}) {
    const int64_t cluster = n / kVec / kPacks / threads;
    if (cluster < 1 || cluster > 16 || cluster * threads * kPacks * kVec != n) continue;
    const size_t shared = slot_bytes * kPacks * threads;
    const int resident = rows::resident_clusters(kernel, int(cluster), threads, shared);
    CHECK(cudaMemset(a.y, 0, bytes));
    const float us = timer.median_us([&] {
      CHECK(rows::launch_clusters(kernel, std::min<int64_t>(rows, resident), int(cluster), threads, shared, nullptr,
                                  std::make_tuple(a)));
    });
    const float worst = largest_difference(a.y, launcher_y);
    std::printf("| %s | %s | (%lld, %lld) | %d x %d | %lld | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.3g |\n",
                Math::kCentered ? "layer_norm" : "rms_norm", name, (long long)rows, (long long)n, threads, kPacks,
                (long long)cluster, resident, copy, launcher, us, copy / launcher, copy / us, worst);
  }
}

template <typename T, typename Math>
void shape(Timer& timer, DType dtype, const char* name, int64_t rows, int64_t n) {
  const NormRows<T, Math> buffers(rows, n, rows);
  const NormForwardArgs<T> a = buffers.args;
  const NormShape norm{dtype, rows, n, Math::kCentered ? NormKind::Layer : NormKind::Rms, "probe"};
  const NormForwardBuffers<> io{a.x, nullptr, a.weight, a.bias, a.y, nullptr, Math::kCentered ? a.mean : nullptr,
                                a.rstd};
  T *copy_in, *copy_out;
  CHECK(cudaMalloc(&copy_in, buffers.bytes()));
  CHECK(cudaMalloc(&copy_out, buffers.bytes()));
  const float copy = timer.copy_us(copy_in, copy_out, buffers.bytes());
  const float launcher = timer.median_us([&] { CHECK(norm_forward(norm, io, 1e-5, nullptr)); });
  std::vector<T> launcher_y(rows * n);
  CHECK(cudaMemcpy(launcher_y.data(), a.y, buffers.bytes(), cudaMemcpyDeviceToHost));
  run<T, Math, 4>(timer, name, a, rows, n, buffers.bytes(), copy, launcher, launcher_y);
  run<T, Math, 8>(timer, name, a, rows, n, buffers.bytes(), copy, launcher, launcher_y);
  CHECK(cudaFree(copy_in));
  CHECK(cudaFree(copy_out));
}

int main() {
  Timer timer;
  std::printf(
      "| norm | dtype | shape | threads x packs | cluster | resident clusters | copy µs | launcher µs | µs | "
      "launcher of copy | of copy | max |y diff| |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 8192}, {8192, 16384}, {4096, 32768},
                         {2048, 65536}, {1024, 131072}, {512, 262144}}) {
    shape<__nv_bfloat16, RmsNormMath>(timer, DType::BFloat16, "bfloat16", rows, n);
    shape<__nv_bfloat16, LayerNormMath>(timer, DType::BFloat16, "bfloat16", rows, n);
  }
  for (auto [rows, n] :
       {std::pair<int64_t, int64_t>{8192, 16384}, {2048, 32768}, {1024, 65536}, {512, 131072}, {256, 262144}}) {
    shape<float, RmsNormMath>(timer, DType::Float, "float32", rows, n);
    shape<float, LayerNormMath>(timer, DType::Float, "float32", rows, n);
  }
  return 0;
}
