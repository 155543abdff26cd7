// The table of one multi-tensor norm launch, filled on the host and passed
// by value as a kernel argument. Plain C++: the torch glue includes it.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fastreduce {

// Tensors per launch: the table travels as a kernel argument, within the
// 4 KiB every CUDA 12 driver accepts.
constexpr int kForeachTensors = 96;
constexpr int64_t kForeachChunk = 1 << 16;  // elements per block of pass 1

struct ForeachTable {
  const void* inputs[kForeachTensors];
  void* outputs[kForeachTensors];   // each tensor's 0-dim norm
  int64_t numel[kForeachTensors];
  int32_t first_chunk[kForeachTensors + 1];  // chunks of tensor t: [first_chunk[t], first_chunk[t + 1])
  DType dtype[kForeachTensors];      // float, half or bfloat16; the output's too
  int count;
};

}  // namespace fastreduce
