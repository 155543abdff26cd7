// Launchers for the kernel ladder (ladder/table.h lists the rungs).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

// Workspace for any rung summing n elements.
size_t ladder_workspace_bytes(int64_t n);

// Sums x[0, n) of `dtype` (Float, BFloat16 or Int32) with rung `rung` into
// one element of torch.sum's output type at `out`.
cudaError_t ladder_sum(int rung, DType dtype, const void* x, int64_t n, void* out, void* workspace,
                       int sm_count, cudaStream_t stream);

// Reads `bytes` bytes (a multiple of 16, 16-byte aligned) and writes nothing
// that matters: the bandwidth ceiling. `flag` is one unsigned int of scratch.
cudaError_t read_probe(const void* data, int64_t bytes, void* flag, int sm_count, cudaStream_t stream);

}  // namespace fastreduce
