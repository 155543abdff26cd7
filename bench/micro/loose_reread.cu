// The norm forward of loose rows (odd widths: PackedRow) read twice
// (norm_forward_reread_kernel with kLoose) against what the launcher runs
// for them (norm_forward_loose_kernel, the row in registers, up to 2048
// packs; past it other kernels), at four packs a thread with and without
// the L2 keep hint and eight with it. Prints µs, registers, blocks an SM,
// the copy of the same bytes, the launcher's time and the largest |y|
// difference from its output.
// bash bench/micro/run.sh loose_reread
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/false);
  const auto time_kernel = [&](auto kernel, int packs, const char* what) {
    c.time_kernel(timer, kernel, rows::block_lane_threads(loose_row_packs<kVec>(n), packs), packs, what);
  };
  time_kernel(norm_forward_reread_kernel<T, 4, Math, true, true>, 4, "read twice, L2 keep");
  time_kernel(norm_forward_reread_kernel<T, 4, Math, false, true>, 4, "read twice");
  time_kernel(norm_forward_reread_kernel<T, 8, Math, true, true>, 8, "read twice, L2 keep");
  c.launcher_again(timer);
}

template <typename T>
void shapes(Timer& timer) {
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{8192, 4095}, {4096, 8191}, {8192, 6001}, {8192, 12001},
                                {8192, 16383}}) {
    run<T, RmsNormMath>(timer, rows, n);
    run<T, LayerNormMath>(timer, rows, n);
  }
}

int main() {
  Timer timer;
  forward_table_header();
  for (int pass = 0; pass < 2; ++pass) {
    shapes<float>(timer);
    shapes<__nv_bfloat16>(timer);
  }
  return 0;
}
