// One softmax call over contiguous (rows, n) data, as the torch glue, the
// launchers and the CPU kernels see it. Nothing here depends on torch or
// CUDA.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fastreduce {

// Softmax of scale * x over rows of n; with causal = T > 0, row r keeps its
// first r % T + 1 entries and the rest are 0 (GPT-2 attention over (..., T,
// T) scores).
struct SoftmaxShape {
  DType dtype;
  int64_t rows, n, causal;
  double scale;
  const char* op;  // the op's name, for errors
};

struct SoftmaxForwardBuffers {
  const void* x;
  void* y;
};

// dx = scale * y * (dy - sum(dy * y)) over each row's kept entries.
struct SoftmaxBackwardBuffers {
  const void* dy;
  const void* y;
  void* dx;
};

}  // namespace fastreduce
