// Launchers for the reductions: raw pointers, a stream, no torch. The caller
// allocates `workspace` of reduce_workspace_bytes() (the torch layer takes it
// from the caching allocator), so a launch never allocates or synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/reduce_problem.h"

namespace fastreduce {

// The problem: reduce_problem.h.

size_t reduce_workspace_bytes(const ReduceProblem& problem, int sm_count);

cudaError_t reduce(const ReduceProblem& problem, void* output, void* workspace, int sm_count,
                   cudaStream_t stream);

}  // namespace fastreduce
