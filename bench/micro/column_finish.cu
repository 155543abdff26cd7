// What the second pass of a split column reduction costs: the plan's first
// pass alone, both passes as run_reduction launches them, and the first pass
// followed by the second at other tile widths and block sizes, with and
// without programmatic dependent launch. Prints µs.
// bash bench/micro/run.sh column_finish
#include <cuda_bf16.h>

#include "../../csrc/kernels/statistic_ops.h"
#include "column_case.cuh"

using namespace fastreduce;
using namespace fastreduce::reduce_plan;
using bf16 = __nv_bfloat16;

template <typename Op, typename In, typename Sink>
void finish_variants(Timer& timer, int sm_count, const char* name, const char* dtype, int64_t len, int64_t inner,
                     const Op& op) {
  using Acc = typename Op::acc_t;
  const ColumnCase<In, Sink> c(len, inner);
  const In* const x = c.x;
  const Plan plan = plan_for<Op, In, Sink>(c.problem, sm_count);
  void* workspace;
  CHECK(cudaMalloc(&workspace, workspace_bytes<Op, In, Sink>(c.problem, sm_count) + 16));
  auto* partials = static_cast<Acc*>(workspace);
  constexpr int kPack = kColumnPack<Op, In>, kRows = kColumnRows<Op, In>;
  const auto first =
      reduce_columns_kernel<Op, In, Acc*, false, kPack, kFullTileWidth<Op, In>, kColumnThreads, kRows>;
  const dim3 grid(ceil_div(inner, int64_t(plan.team) * plan.vec), plan.segments);
  auto first_pass = [&] {
    CHECK((launch_kernel(first, grid, kColumnThreads, 0, nullptr, After::Stream, x, len, inner, plan.segments,
                         plan.chunk, plan.team, partials, op)));
  };
  auto line = [&](const char* what, float us) {
    std::printf("| %s | %s | (%lld, %lld) | %lld x %lld | %s | %.1f |\n", name, dtype, (long long)len,
                (long long)inner, (long long)grid.x, (long long)plan.segments, what, us);
  };
  if (plan.segments == 1 || plan.team != kColumnTile || plan.vec != kPack) {
    line("not a split full-tile plan", 0);
    CHECK(cudaFree(workspace));
    return;
  }
  line("first pass alone", timer.median_us(first_pass));
  line("both passes, as run", timer.median_us([&] {
         CHECK((run_reduction<Op, In, Sink>(c.problem, op, c.sink, workspace, sm_count, nullptr)));
       }));
  const CombinePartials<Op> finish_op{op};
  auto both = [&](auto threads, int width, After after) {
    constexpr int kThreads = decltype(threads)::value;
    const auto finish = reduce_columns_kernel<CombinePartials<Op>, Acc, Sink, true, 1, 0, kThreads>;
    return timer.median_us([&] {
      first_pass();
      CHECK((launch_kernel(finish, dim3(ceil_div(inner, int64_t(width))), kThreads, 0, nullptr, after, partials,
                           plan.segments, inner, int64_t(1), plan.segments, width, c.sink, finish_op)));
    });
  };
  for (int width : {32, 16, 8, 4, 2}) {
    if (width * sizeof(Acc) < 8) continue;
    char what[96];
    std::snprintf(what, sizeof what, "+ second pass, tiles of %d, 256 threads", width);
    line(what, both(std::integral_constant<int, 256>{}, width, After::Producer));
    std::snprintf(what, sizeof what, "+ second pass, tiles of %d, 1024 threads", width);
    line(what, both(std::integral_constant<int, 1024>{}, width, After::Producer));
  }
  line("+ second pass, tiles of 32, 1024 threads, no early launch",
       both(std::integral_constant<int, 1024>{}, 32, After::Stream));
  CHECK(cudaFree(workspace));
}

int main() {
  Timer timer;
  int sm_count = 0;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const ReduceParams params{};
  for (int round = 1; round <= 2; ++round) {
    std::printf("\nround %d\n\n| op | dtype | shape | tiles x segments | launches | µs |\n|---|---|---|---|---|---|\n",
                round);
    finish_variants<SumOp<float>, float, float*>(timer, sm_count, "sum", "fp32", 65536, 128, SumOp<float>{});
    finish_variants<SumOp<float>, float, float*>(timer, sm_count, "sum", "fp32", 65536, 768, SumOp<float>{});
    finish_variants<SumOp<float>, bf16, bf16*>(timer, sm_count, "sum", "bf16", 65536, 768, SumOp<float>{});
    finish_variants<SumOp<float>, bf16, bf16*>(timer, sm_count, "sum", "bf16", 8192, 8192, SumOp<float>{});
    finish_variants<VarOp<float>, bf16, PairSink<bf16>>(timer, sm_count, "var_mean", "bf16", 65536, 768,
                                                        VarOp<float>::make(params, 65536));
    finish_variants<VarOp<float>, float, PairSink<float>>(timer, sm_count, "var_mean", "fp32", 65536, 128,
                                                          VarOp<float>::make(params, 65536));
  }
  return 0;
}
