// Launcher for scale_unless_one: raw pointers, a stream, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../kernels/dtype.h"

namespace fastreduce {

// data (n contiguous elements of dtype) *= *factor, a device value of the
// data's dtype (factor_of_data_type) or else of its accumulator type (float,
// double for double); nothing is written when it is 1.
cudaError_t scale_unless_one(DType dtype, void* data, int64_t n, const void* factor, bool factor_of_data_type,
                             int sm_count, cudaStream_t stream);

}  // namespace fastreduce
