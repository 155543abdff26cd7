// What the column probes share: a (len, inner) input of In filled with
// values in [-2, 2), room for two output rows, the problem as the plan sees
// it (its kind and dtype are the op's business, not the plan's) and the
// op's sink over the outputs; freed with the case.
#pragma once

#include <type_traits>

#include "../../csrc/launch/reduce_plan.cuh"
#include "probe.cuh"

template <typename In, typename Sink>
struct ColumnCase {
  In* x = nullptr;
  void* out = nullptr;
  fastreduce::ReduceProblem problem;
  Sink sink;
  ColumnCase(int64_t len, int64_t inner) {
    CHECK(cudaMalloc(&x, len * inner * sizeof(In)));
    CHECK(cudaMalloc(&out, 2 * inner * sizeof(double)));
    fill_uniform<<<1024, 256>>>(x, len * inner, 7, -2.0f, 4.0f);
    problem = {fastreduce::ReduceKind::Sum, fastreduce::DType::Float, x, 1, len, inner};
    if constexpr (std::is_pointer_v<Sink>) {
      sink = static_cast<Sink>(out);
    } else {
      using Out = decltype(Sink::first);
      sink = Sink{static_cast<Out>(out), static_cast<Out>(out) + inner};
    }
  }
  ColumnCase(const ColumnCase&) = delete;
  ColumnCase& operator=(const ColumnCase&) = delete;
  ~ColumnCase() {
    cudaFree(out);
    cudaFree(x);
  }
};
