// Rows in one block of up to kWideRowThreads (1024) threads at 8 packs a
// thread, no cluster: the norm forward's lanes kernel at that launch bound
// (64 registers a thread; ptxas: no spills) against the launcher, which
// splits these rows over a cluster (the pipelined kernel), and a copy of the
// same bytes. Two-byte rows of 16385-32768 already run one block at 4 packs
// (norms.cu: H100 bf16 (4096, 32768) rms_norm 183.2 -> 175.7 µs, layer_norm
// 193.1 -> 178.7). The question: do float rows of 16385-32768 and two-byte
// rows of 32769-65536 gain at 8 packs? H100 (2026-12-07), µs, launcher ->
// one block: rms_norm float32 (4096, 32768) 366.0 -> 358.1, (6144, 20000)
// 335.7 -> 329.1 (taken: norms.cu); layer_norm float32 366.2 -> 442.3,
// 343.5 -> 431.4; bf16 (2048, 65536) rms_norm 182.0 -> 181.9, layer_norm
// 182.9 -> 191.8; (4096, 40000) 225.2 -> 221.2 and 224.5 -> 236.7.
// Why layer_norm's float rows lose: on the kernel that checks its
// parameters, without the bias, (4096, 32768) runs 360.4 and (6144, 20000)
// 330.2 (no parameters: 357.2, 326.6), against 443.2 and 430.1 compiled for
// both given, whose SASS issues four of the eight x packs after branches
// that sum earlier packs. bf16 rows lose to the parameters' loads at the
// stores (65536: 183.6 without them, 190.4 with the weight, 191.7 both).
// With both given, the checking kernel ran 406 at 32768 (the launcher of a
// build that took it, bench/peers.py's harness): float layer_norm rows keep
// their clusters. Loading float packs as words (load_or_zero) straightened
// the kAffine kernel's SASS (all eight x packs before the first sum) but
// ran 404 (H100, NOTES.md): the parameters' loads at the stores cost the
// time, not the order of the row's loads.
//   bash bench/micro/run.sh one_block_rows
#include <cuda_bf16.h>

#include "../../csrc/launch/rows.h"
#include "norm_rows.cuh"
using namespace fastreduce;

template <typename T, typename Math>
void shape(Timer& timer, int64_t rows, int64_t n) {
  constexpr int kVec = Vec16<T>::kSize, kPacks = 8;
  ForwardCase<T, Math> c(timer, rows, n, /*fused_add=*/false);
  const int threads = int(rows::fewest_threads_holding(n / kVec, 1, kPacks));
  c.time_kernel(timer,
                norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack,
                                          ResidualAdd::kNone, /*kAffine=*/true, false, T, kWideRowThreads>,
                threads, kPacks, "lanes, one block");
  // The kernel that checks its parameters (kAffine = false): with both given
  // (y checked against the launcher's), then without them and without the
  // bias, where the output pass loads less: what that saves is the cost of
  // those loads (y is not the launcher's there, so its difference is not a
  // check).
  const NormForwardArgs<T> given = c.args;
  const auto checking = [&](const char* what) {
    c.time_kernel(timer,
                  norm_forward_lanes_kernel<T, kPacks, kVec, false, Math, false, ParamLoads::kPerPack,
                                            ResidualAdd::kNone, /*kAffine=*/false, false, T, kWideRowThreads>,
                  threads, kPacks, what);
  };
  checking("one block, parameters checked");
  c.args.weight = nullptr, c.args.bias = nullptr;
  checking("one block, no parameters");
  if (Math::kCentered) {
    c.args.weight = given.weight;
    checking("one block, no bias");
  }
  c.args = given;
  c.launcher_again(timer);
}

int main() {
  Timer timer;
  forward_table_header();
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 32768}, {6144, 20000}}) {
    shape<float, RmsNormMath>(timer, rows, n);
    shape<float, LayerNormMath>(timer, rows, n);
  }
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{2048, 65536}, {4096, 40000}}) {
    shape<__nv_bfloat16, RmsNormMath>(timer, rows, n);
    shape<__nv_bfloat16, LayerNormMath>(timer, rows, n);
  }
}
