// Times the softmax forward kernels alone, L2 evicted before each call,
// against a copy of the same bytes: block rows (the row in registers) at 4,
// 2 and 1 packs a thread (4: what the launcher picks past 1024 elements),
// and rows of up to 1024 a warp each. On the GPU machine:
// bash bench/micro/run.sh softmax_rows. NOTES.md keeps what it showed.
#include <cuda_bf16.h>

#include "../../csrc/kernels/softmax_kernels.cuh"
#include "probe.cuh"

using namespace fastreduce;

template <typename T>
void run(Timer& timer, int64_t rows, int64_t n, const char* dtype) {
  constexpr int kVec = 16 / sizeof(T);
  T *x, *y;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  fill_uniform<<<1024, 256>>>(x, rows * n, 1u, -4.0f, 8.0f);
  const float copy = timer.copy_us(x, y, rows * n * int64_t(sizeof(T)));
  const int groups = int(n / kVec);
  auto block = [&](auto kernel, int packs) {
    int threads = kWarpSize;
    while (threads * packs < groups) threads *= 2;
    if (threads > kRowThreadsMax) return -1.0f;  // beyond the kernel's launch bound
    return timer.median_us([&] { kernel<<<rows, threads>>>(x, y, rows, int(n), 0, opmath_t<T>(1)); });
  };
  std::printf("| %s | (%lld, %lld) | %.1f | %.1f | %.1f | %.1f |", dtype, (long long)rows, (long long)n, copy,
              block(softmax_forward_lanes_kernel<T, 4, kVec, false, false>, 4),
              block(softmax_forward_lanes_kernel<T, 2, kVec, false, false>, 2),
              block(softmax_forward_lanes_kernel<T, 1, kVec, false, false>, 1));
  if (n <= 1024) {
    const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
    auto lanes = [&](auto kernel) {
      return timer.median_us(
          [&] { kernel<<<blocks, kWarpRowsPerBlock * kWarpSize>>>(x, y, rows, int(n), 0, opmath_t<T>(1)); });
    };
    // The fewest packs a lane that cover the row, as with_lanes picks them.
    const float warp = groups <= 3 * kWarpSize   ? lanes(softmax_forward_lanes_kernel<T, 3, kVec, true, false>)
                               : groups <= 4 * kWarpSize ? lanes(softmax_forward_lanes_kernel<T, 4, kVec, true, false>)
                               : groups <= 6 * kWarpSize ? lanes(softmax_forward_lanes_kernel<T, 6, kVec, true, false>)
                                                         : lanes(softmax_forward_lanes_kernel<T, 8, kVec, true, false>);
    std::printf(" %.1f |\n", warp);
  } else {
    std::printf(" - |\n");
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
}

int main() {
  Timer timer;
  std::printf("| dtype | shape | copy µs | block, 4 packs a thread µs | 2 packs µs | 1 pack µs | warp rows µs |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{8192, 768}, {32768, 1024}, {8192, 1600}, {8192, 4096},
                         {4096, 8192}, {8192, 16384}}) {
    run<__nv_bfloat16>(timer, rows, n, "bfloat16");
    run<float>(timer, rows, n, "float32");
  }
  return 0;
}
