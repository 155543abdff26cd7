// Launcher of the multi-tensor norm: raw pointers, a stream, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "../kernels/dtype.h"

namespace fastreduce {

struct ForeachTable;

// Float accumulator partials of one table's chunks.
size_t foreach_norm_workspace_bytes(int32_t chunks);

// The `ord` norm of every tensor of `table` (its chunk count in
// table.first_chunk[table.count]) into its output, with float accumulators.
cudaError_t foreach_norm(const ForeachTable& table, double ord, void* workspace, cudaStream_t stream);

}  // namespace fastreduce
