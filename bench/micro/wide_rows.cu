// Times the block-per-row norm forward (the row in registers) on wide rows
// alone, L2 evicted before each call, against a copy of the same bytes, at
// two and four packs per thread. Build and run on the GPU machine:
// bash bench/micro/run.sh wide_rows. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n, const char* dtype) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr bool kCentered = Math::kCentered;
  const NormRows<T, Math> buffers(rows, n, rows);
  const NormForwardArgs<T> a = buffers.args;
  const float copy = timer.copy_us(buffers.x, buffers.y, buffers.bytes());
  const int groups = int(n / kVec);
  auto time = [&](auto kernel, int packs) {
    const int threads = (groups + packs - 1) / packs;
    if (threads > kRowThreadsMax) return -1.0f;  // beyond the kernel's launch bound
    return timer.median_us([&] { kernel<<<rows, threads>>>(a); });
  };
  const float four = time(norm_forward_lanes_kernel<T, 4, kVec, false, Math>, 4);
  const float two = time(norm_forward_lanes_kernel<T, 2, kVec, false, Math>, 2);
  std::printf("| %s | %s | (%lld, %lld) | %.1f | %.1f | %.1f |\n", kCentered ? "layer_norm" : "rms_norm", dtype,
              (long long)rows, (long long)n, copy, four, two);
}

int main() {
  Timer timer;
  std::printf("| norm | dtype | shape | copy µs | 4 packs a thread µs | 2 packs µs |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 4096}, {4096, 8192}, {2048, 16384}}) {
    run<__nv_bfloat16, LayerNormMath>(timer, rows, n, "bfloat16");
    run<__nv_bfloat16, RmsNormMath>(timer, rows, n, "bfloat16");
    if (n <= 8192) {
      run<float, LayerNormMath>(timer, rows, n, "float32");
      run<float, RmsNormMath>(timer, rows, n, "float32");
    }
  }
  return 0;
}
