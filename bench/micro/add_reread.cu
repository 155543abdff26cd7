// The fused add's norm forward read twice (norm_forward_reread_kernel with
// kAdd: the first read adds the residual, stores h and sums it; the second
// reads h back) against the launcher's time (the row in registers before
// the change, the kernel with h kept in L2 after), with and without the L2
// keep hint on h's store, four packs a thread and two. Prints µs,
// registers, blocks an SM, the copy of the same bytes (x and the residual
// in, h and y out), the launcher's time and the largest |y| difference from
// its output.
// bash bench/micro/run.sh add_reread
#include <cuda_bf16.h>

#include "../../csrc/launch/norms.h"
#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"

using namespace fastreduce;

template <typename T, typename Math>
void run(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/true);
  const auto time_kernel = [&](auto kernel, int packs, const char* what) {
    c.time_kernel(timer, kernel, rows::block_lane_threads(n / kVec, packs), packs, what);
  };
  time_kernel(norm_forward_reread_kernel<T, 4, Math, true, false, true>, 4, "read twice, h kept in L2");
  time_kernel(norm_forward_reread_kernel<T, 4, Math, false, false, true>, 4, "read twice");
  time_kernel(norm_forward_reread_kernel<T, 2, Math, false, false, true>, 2, "read twice");
  c.launcher_again(timer);
}

int main() {
  Timer timer;
  forward_table_header();
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{4096, 8192}, {8192, 4096}, {8192, 16384}, {4096, 6144}}) {
      run<__nv_bfloat16, LayerNormMath>(timer, rows, n);
      run<__nv_bfloat16, RmsNormMath>(timer, rows, n);
    }
    run<float, LayerNormMath>(timer, 4096, 8192);
    run<float, RmsNormMath>(timer, 4096, 8192);
  }
  return 0;
}
