// The reduction entry points: each kind goes to its family's translation
// unit. This one holds sum, mean, prod, amax and amin.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "reduce_families.h"
#include "reduce_plan.cuh"

namespace fastreduce {
namespace {

struct VisitBasic {
  template <typename F>
  cudaError_t operator()(const ReduceProblem& p, F&& f) const {
    return visit_reduction<__half, __nv_bfloat16>(p.kind, p.dtype, cudaErrorInvalidValue, [&](auto kind, auto tag) {
      using Types = ReduceTypes<decltype(kind)::value, typename decltype(tag)::type>;
      return f(Types::op_t::make(p.params, p.len), tag, TypeTag<typename Types::out_t*>{});
    });
  }
};

enum class Family { Basic, Statistic, Selection };

Family family_of(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Var:
    case ReduceKind::LogSumExp:
    case ReduceKind::Norm: return Family::Statistic;
    case ReduceKind::ArgMax:
    case ReduceKind::ArgMin:
    case ReduceKind::MinMax:
    case ReduceKind::Any:
    case ReduceKind::All: return Family::Selection;
    default: return Family::Basic;
  }
}

}  // namespace

size_t reduce_workspace_bytes(const ReduceProblem& problem, int sm_count) {
  switch (family_of(problem.kind)) {
    case Family::Statistic: return statistic_workspace_bytes(problem, sm_count);
    case Family::Selection: return selection_workspace_bytes(problem, sm_count);
    default: return reduce_plan::family_workspace_bytes(problem, sm_count, VisitBasic{});
  }
}

cudaError_t reduce(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                   cudaStream_t stream) {
  switch (family_of(problem.kind)) {
    case Family::Statistic: return reduce_statistic(problem, output, workspace, sm_count, stream);
    case Family::Selection: return reduce_selection(problem, output, workspace, sm_count, stream);
    default: return reduce_plan::family_reduce(problem, output, workspace, sm_count, stream, VisitBasic{});
  }
}

}  // namespace fastreduce
