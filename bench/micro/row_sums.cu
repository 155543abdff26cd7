// float32 sums over rows and whole tensors as the plan runs them (both
// passes where there are two), a thread's round of loads added as a tree
// (SumOp's fold_tree) against the dependent chain of adds it replaced.
// Prints µs and GB/s of the input, two rounds. bash bench/micro/run.sh row_sums
#include <vector>

#include "../../csrc/launch/reduce_plan.cuh"
#include "probe.cuh"

using namespace fastreduce;
using namespace fastreduce::reduce_plan;

// SumOp adding element by element (fold_tree hidden).
struct ChainSum : SumOp<float> {
  template <typename In, int N>
  float fold_tree(float, const In (&)[N], int64_t) const = delete;
};

int main() {
  Timer timer;
  int sm_count;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "| shape | dim | plan | chain µs | tree µs | tree GB/s | largest difference |\n"
      "|---|---|---|---|---|---|---|\n");
  const int64_t total = int64_t(1) << 26;
  float *x, *out;
  void* workspace;
  CHECK(cudaMalloc(&x, total * sizeof(float)));
  CHECK(cudaMalloc(&out, 2 * (total / 32) * sizeof(float)));
  CHECK(cudaMalloc(&workspace, 64 << 20));
  fill_uniform<<<1024, 256>>>(x, total, 7, -2.0f, 4.0f);
  for (int round = 0; round < 2; ++round)
    for (int64_t len : {int64_t(32), int64_t(64), int64_t(128), int64_t(256), int64_t(512), int64_t(768),
                        int64_t(1024), int64_t(2048), int64_t(8192), int64_t(1) << 20, int64_t(1) << 24, total}) {
      const int64_t rows = total / len;
      const ReduceProblem problem{ReduceKind::Sum, DType::Float, x, rows, len, 1};
      const Plan plan = plan_for<SumOp<float>, float, float*>(problem, sm_count);
      float* const chained = out;
      float* const treed = out + total / 32;
      const float chain_us = timer.median_us([&] {
        CHECK((run_reduction<ChainSum, float, float*>(problem, ChainSum{}, chained, workspace, sm_count, nullptr)));
      });
      const float tree_us = timer.median_us([&] {
        CHECK((run_reduction<SumOp<float>, float, float*>(problem, SumOp<float>{}, treed, workspace, sm_count,
                                                          nullptr)));
      });
      std::vector<float> a(rows), b(rows);
      CHECK(cudaMemcpy(a.data(), chained, rows * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(b.data(), treed, rows * sizeof(float), cudaMemcpyDeviceToHost));
      float worst = 0;
      for (int64_t i = 0; i < rows; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
      const char* layout = plan.layout == Plan::Layout::All ? "all" : plan.segments > 1 ? "split rows" : "rows";
      std::printf("| (%lld, %lld) | 1 | %s, team %d, threads %d, segments %lld | %.2f | %.2f | %.0f | %.3g |\n",
                  (long long)rows, (long long)len, layout, plan.team, plan.threads, (long long)plan.segments,
                  chain_us, tree_us, double(total) * sizeof(float) / (tree_us * 1e3), worst);
    }
  CHECK(cudaFree(workspace));
  CHECK(cudaFree(out));
  CHECK(cudaFree(x));
}
