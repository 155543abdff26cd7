// The norm forward of one-block two-byte rows read twice
// (norm_forward_reread_kernel: the sums from a first read that holds no
// pack past its use, the output from a second that finds the row in L2, as
// torch.compile's looped reduction does) against the row held in registers
// (norm_forward_lanes_kernel, what the launcher ran for them before), at
// one, two, four (the launcher's choice, its threads) and eight packs a
// thread, four with and without the L2 keep hint. Prints µs, registers,
// blocks an SM, the copy of the same bytes, the launcher's time and the
// largest |y| difference from its output, bf16 and float16.
// bash bench/micro/run.sh reread_rows
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/false);
  const int threads = rows::block_lane_threads(n / kVec);
  const auto time_kernel = [&](auto kernel, int threads_here, int packs, size_t shared, const char* what) {
    c.time_kernel(timer, kernel, threads_here, packs, what, shared);
  };
  // The row in registers as the launcher ran it (three packs a thread where
  // they hold the row): layer_norm compiled for both parameters; rms_norm
  // with its weight staged in shared memory, its parameters preloaded below
  // 512 threads.
  const auto in_registers = [&](auto packs) {
    constexpr int kPacks = decltype(packs)::value;
    if constexpr (Math::kCentered) {
      time_kernel(
          norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack, ResidualAdd::kNone, true>,
          threads, kPacks, 0, "in registers");
    } else {
      const size_t staged = size_t(kPacks) * threads * sizeof(Vec16<T>);
      if (threads == kRowThreadsMax)
        time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false>, threads, kPacks, staged,
                    "in registers");
      else
        time_kernel(norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kBeforeOutput>, threads,
                    kPacks, staged, "in registers");
    }
  };
  if (n / kVec <= 3 * threads)
    in_registers(std::integral_constant<int, 3>{});
  else
    in_registers(std::integral_constant<int, 4>{});
  // Read twice with the L2 keep hint where the launcher gives it (rows past
  // 8192), four packs a thread with and without it.
  const auto read_twice = [&](auto packs, int threads_here) {
    constexpr int kPacks = decltype(packs)::value;
    if (threads_here > kRowThreadsMax) return;
    if (n > 8192 || kPacks == 4) time_kernel(norm_forward_reread_kernel<T, kPacks, Math, true>, threads_here, kPacks, 0,
                                             "read twice, L2 keep");
    if (n <= 8192 || kPacks == 4) time_kernel(norm_forward_reread_kernel<T, kPacks, Math, false>, threads_here, kPacks,
                                              0, "read twice");
  };
  read_twice(std::integral_constant<int, 1>{}, threads * 4);
  read_twice(std::integral_constant<int, 2>{}, threads * 2);
  read_twice(std::integral_constant<int, 4>{}, threads);
  read_twice(std::integral_constant<int, 8>{}, threads / 2);
  c.launcher_again(timer);
}

template <typename T>
void shapes(Timer& timer) {
  run<T, RmsNormMath>(timer, 8192, 16384);
  run<T, LayerNormMath>(timer, 8192, 16384);
  run<T, RmsNormMath>(timer, 4096, 8192);
  run<T, LayerNormMath>(timer, 4096, 8192);
  run<T, RmsNormMath>(timer, 8192, 4096);
  run<T, LayerNormMath>(timer, 8192, 4096);
  run<T, LayerNormMath>(timer, 8192, 6000);
  run<T, LayerNormMath>(timer, 8192, 4104);
  run<T, RmsNormMath>(timer, 8192, 6000);
  run<T, RmsNormMath>(timer, 8192, 4104);
}

int main() {
  Timer timer;
  forward_table_header();
  for (int pass = 0; pass < 2; ++pass) {
    shapes<__nv_bfloat16>(timer);
    shapes<__half>(timer);
  }
  return 0;
}
