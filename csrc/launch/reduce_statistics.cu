// The reductions of var/std (with the mean), logsumexp and vector norms.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../kernels/statistic_ops.h"
#include "reduce_families.h"
#include "reduce_plan.cuh"

namespace fastreduce {
namespace {

struct Visit {
  template <typename F>
  cudaError_t operator()(const ReduceProblem& p, F&& f) const {
    return visit_statistic<__half, __nv_bfloat16, false>(p.kind, p.dtype, p.params, p.len, cudaErrorInvalidValue, f);
  }
};

}  // namespace

size_t statistic_workspace_bytes(const ReduceProblem& problem, int sm_count) {
  return reduce_plan::family_workspace_bytes(problem, sm_count, Visit{});
}

cudaError_t reduce_statistic(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                             cudaStream_t stream) {
  return reduce_plan::family_reduce(problem, output, workspace, sm_count, stream, Visit{});
}

}  // namespace fastreduce
