// The first pass of a column reduction (reduce_kernels.cuh's column kernel)
// for the ops of the family over each input width: as the plan runs it (both
// passes), compiled for full tiles of 32 threads, the same tiles at a
// run-time width, narrower tiles, and (per op) half the columns a thread or
// twice the rows in flight (bytes of any/all: 8 rows folded as a word; wide
// accumulators: twice the columns), each at the segments its own occupancy
// gives (the plan's rule), beside a read of the same bytes. Prints µs and
// GB/s of the input, two rounds; an op's name as the argument probes it
// alone. bash bench/micro/run.sh column_walk [op]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "../../csrc/kernels/selection_ops.h"
#include "../../csrc/kernels/statistic_ops.h"
#include "column_case.cuh"

using namespace fastreduce;
using namespace fastreduce::reduce_plan;
using bf16 = __nv_bfloat16;

struct Problem {
  Timer& timer;
  int sm_count;
  const char* op;
  const char* dtype;
  int64_t len, inner;
  size_t elem;
  const void* x;
  void* partials;
  void row(const char* what, int regs, int resident, int64_t blocks, float us) const {
    const double gbs = double(len) * inner * elem / (us * 1e3);
    std::printf("| %s | %s | (%lld, %lld) | %s | %d | %d | %lld | %.1f | %.0f |\n", op, dtype, (long long)len,
                (long long)inner, what, regs, resident, (long long)blocks, us, gbs);
  }
};

// The first pass with kVec columns a thread, tiles tile_threads wide (kTile
// 0: at run time) and kUnroll rows in flight a lane.
template <typename Op, typename In, int kVec, int kTile, int kUnroll>
void first_pass(const Problem& p, const Op& op, int tile_threads = kTile) {
  using Acc = typename Op::acc_t;
  const auto kernel = reduce_columns_kernel<Op, In, Acc*, false, kVec, kTile, kColumnThreads, kUnroll>;
  const int resident = std::max(resident_blocks(kernel, kColumnThreads), 1);
  const int64_t tiles = ceil_div(p.inner, int64_t(tile_threads) * kVec);
  const int64_t segments =
      std::max<int64_t>(std::min<int64_t>(int64_t(resident) * p.sm_count / tiles, p.len / kMinColumnSegmentRows), 1);
  const int64_t chunk = ceil_div(p.len, segments);
  const dim3 grid(tiles, ceil_div(p.len, chunk));
  const float us = p.timer.median_us([&] {
    CHECK((launch_kernel(kernel, grid, kColumnThreads, 0, nullptr, After::Stream, static_cast<const In*>(p.x), p.len,
                         p.inner, int64_t(grid.y), chunk, tile_threads, static_cast<Acc*>(p.partials), op)));
  });
  char what[96];
  std::snprintf(what, sizeof what, "%d columns, tiles of %d%s, %d rows a lane", kVec, tile_threads,
                kTile != 0 ? " (compiled)" : "", kUnroll);
  p.row(what, registers(kernel), resident, int64_t(grid.x) * grid.y, us);
}

// The op to probe alone (the command line's argument), or every op.
const char* only_op = nullptr;

template <typename Op, typename In, typename Sink>
void shapes(Timer& timer, int sm_count, const char* name, const char* dtype, int64_t len, int64_t inner,
            const Op& op, bool brief = false) {
  using Acc = typename Op::acc_t;
  if (only_op && std::strcmp(only_op, name) != 0) return;
  const ColumnCase<In, Sink> c(len, inner);
  void* workspace;
  CHECK(cudaMalloc(&workspace, (len / kMinColumnSegmentRows + 1) * inner * sizeof(Acc)));
  const Problem p{timer, sm_count, name, dtype, len, inner, sizeof(In), c.x, workspace};
  const Plan plan = plan_for<Op, In, Sink>(c.problem, sm_count);
  p.row("both passes, as run", 0, 0, ceil_div(inner, int64_t(plan.team) * plan.vec) * plan.segments,
        timer.median_us(
            [&] { CHECK((run_reduction<Op, In, Sink>(c.problem, op, c.sink, workspace, sm_count, nullptr))); }));
  constexpr int kPack = kColumnPack<Op, In>;
  first_pass<Op, In, kPack, kColumnTile, 4>(p, op);
  for (int width : {32, 16, 8}) first_pass<Op, In, kPack, 0, 4>(p, op, width);
  if (!brief) {
    if constexpr (kPack >= 2) first_pass<Op, In, kPack / 2, 0, 8>(p, op, kColumnTile / 2);
    if constexpr (kPack <= 4) first_pass<Op, In, kPack, 0, 8>(p, op, kColumnTile / 2);
  }
  if constexpr (sizeof(Acc) == 16 && 2 * kPack <= Vec16<In>::kSize) {
    // Wide accumulators at twice the columns a thread (16-byte loads of
    // two-byte columns).
    first_pass<Op, In, 2 * kPack, 0, 4>(p, op, kColumnTile);
    first_pass<Op, In, 2 * kPack, 0, 4>(p, op, kColumnTile / 2);
  }
  if constexpr (sizeof(In) == 1 && FoldsPacks<Op, In, 8>::value) {
    // Bytes folded 8 rows at once (a word a column).
    first_pass<Op, In, 8, 0, 8>(p, op, kColumnTile);
    first_pass<Op, In, 8, 0, 8>(p, op, kColumnTile / 2);
    first_pass<Op, In, 16, 0, 8>(p, op, kColumnTile / 2);
    first_pass<Op, In, 16, 0, 8>(p, op, kColumnTile);
  }
  CHECK(cudaFree(workspace));
}

// The family's ops over a floating type, every variant.
template <typename In>
void family(Timer& timer, int sm_count, const char* dtype, int64_t len, int64_t inner) {
  const ReduceParams params{};
  using Norm2 = NormOp<std::conditional_t<sizeof(In) == 2, double, float>, NormOrder::Two>;
  shapes<SumOp<float>, In, In*>(timer, sm_count, "sum", dtype, len, inner, SumOp<float>{});
  shapes<Norm2, In, In*>(timer, sm_count, "norm", dtype, len, inner, Norm2::make(params, len));
  shapes<VarOp<float>, In, PairSink<In>>(timer, sm_count, "var_mean", dtype, len, inner,
                                         VarOp<float>::make(params, len));
  shapes<LogSumExpOp<float>, In, In*>(timer, sm_count, "logsumexp", dtype, len, inner, LogSumExpOp<float>{});
  shapes<MinMaxOp<float>, In, PairSink<In>>(timer, sm_count, "aminmax", dtype, len, inner, MinMaxOp<float>{});
  shapes<ArgExtremumOp<float, true>, In, int64_t*>(timer, sm_count, "argmax", dtype, len, inner,
                                                   ArgExtremumOp<float, true>{});
}

// Sums, extremes and any/all over the other widths: the tile variants only.
void other_types(Timer& timer, int sm_count, int64_t len, int64_t inner) {
  shapes<LogicalOp<false>, bool, bool*>(timer, sm_count, "any", "bool", len, inner, LogicalOp<false>{}, true);
  shapes<LogicalOp<true>, bool, bool*>(timer, sm_count, "all", "bool", len, inner, LogicalOp<true>{}, true);
  shapes<SumOp<int64_t>, uint8_t, int64_t*>(timer, sm_count, "sum", "uint8", len, inner, SumOp<int64_t>{}, true);
  shapes<SumOp<int64_t>, int16_t, int64_t*>(timer, sm_count, "sum", "int16", len, inner, SumOp<int64_t>{}, true);
  shapes<SumOp<int64_t>, int32_t, int64_t*>(timer, sm_count, "sum", "int32", len, inner, SumOp<int64_t>{}, true);
  shapes<SumOp<double>, double, double*>(timer, sm_count, "sum", "fp64", len / 2, inner, SumOp<double>{}, true);
  shapes<MaxOp<float>, bf16, bf16*>(timer, sm_count, "amax", "bf16", len, inner, MaxOp<float>{}, true);
  shapes<MeanOp<float>, bf16, bf16*>(timer, sm_count, "mean", "bf16", len, inner, MeanOp<float>::make({}, len), true);
}

int main(int argc, char** argv) {
  if (argc > 1) only_op = argv[1];
  Timer timer;
  int sm_count = 0;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  for (int round = 1; round <= 2; ++round) {
    std::printf("\nround %d\n\n| op | dtype | shape | kernel | registers | blocks an SM | blocks | µs | GB/s |\n", round);
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    float* x;
    const int64_t bytes = 65536ll * 768 * 2;
    CHECK(cudaMalloc(&x, bytes));
    const float us = timer.median_us(
        [&] { read_all<<<sm_count * 8, 512>>>(reinterpret_cast<const float4*>(x), bytes / 16, timer.sink); });
    std::printf("| read | | 100.7 MB | read_all | | | | %.1f | %.0f |\n", us, bytes / (us * 1e3));
    CHECK(cudaFree(x));
    for (const auto [len, inner] : {std::pair<int64_t, int64_t>{65536, 768}, {8192, 8192}, {65536, 128}}) {
      family<bf16>(timer, sm_count, "bf16", len, inner);
      family<__half>(timer, sm_count, "fp16", len, inner);
      family<float>(timer, sm_count, "fp32", len / 2, inner);
      other_types(timer, sm_count, len, inner);
    }
  }
  return 0;
}
