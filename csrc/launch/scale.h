// Launcher for scale_unless_one: raw pointers, a stream, no torch.
#pragma once

#include <cuda_runtime.h>

#include "../kernels/scale_problem.h"

namespace fastreduce {

// The problem's scale (scale_problem.h) on the stream; nothing is written
// when the factor is 1.
cudaError_t scale_unless_one(const ScaleProblem& problem, int sm_count, cudaStream_t stream);

}  // namespace fastreduce
