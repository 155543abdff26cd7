// The families of reductions beyond sum/mean/prod/amax/amin, each compiled
// in its own translation unit; reduce.cu routes to them.
#pragma once

#include "reduce.h"

namespace fastreduce {

// var/std (+ mean), logsumexp, norm: reduce_statistics.cu.
size_t statistic_workspace_bytes(const ReduceProblem& problem, int sm_count);
cudaError_t reduce_statistic(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                             cudaStream_t stream);

// argmax/argmin, aminmax, any/all: reduce_selection.cu.
size_t selection_workspace_bytes(const ReduceProblem& problem, int sm_count);
cudaError_t reduce_selection(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                             cudaStream_t stream);

}  // namespace fastreduce
