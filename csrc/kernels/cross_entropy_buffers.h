// One cross-entropy call over (rows, classes) logits with int64 targets, as
// the torch glue, the launchers and the CPU kernels see it. Rows are
// contiguous, `row_stride` elements apart (classes, or more in a view of
// wider rows); the gradient's too, in the same layout. lse,
// row losses, grad_lse and grad_scale are in the accumulator type (float,
// double for double logits). Nothing here depends on torch or CUDA.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fastreduce {

struct CrossEntropyShape {
  DType dtype;
  int64_t rows, classes, row_stride, ignore_index;
  double label_smoothing;
  int reduction;   // 0 none, 1 mean, 2 sum (LossReduction)
  const char* op;  // the op's name, for errors
};

// loss: rows elements of the logits' dtype (reduction none) or one; lse: rows.
struct CrossEntropyForwardBuffers {
  const void* logits;
  const int64_t* target;
  void* loss;
  void* lse;
};

// grad_loss: as the forward's loss; grad_lse may be null.
struct CrossEntropyBackwardBuffers {
  const void* grad_loss;
  const void* grad_lse;
  const void* logits;
  const int64_t* target;
  const void* lse;
  void* grad_input;
};

// The gradient of *grad_scale times the summed row losses (grad_scale null:
// 1; with the shape's reduction mean, of their mean over the rows not
// ignored) in one pass; grad_input may be the logits (in place). The rows'
// lse and losses go to lse and row_loss (rows, accumulator type), their sum
// or mean to loss (one element of the logits' dtype); any of the three may be
// null.
struct CrossEntropyWithGradBuffers {
  const void* logits;
  const int64_t* target;
  const void* grad_scale;
  void* lse;
  void* row_loss;
  void* loss;
  void* grad_input;
};

}  // namespace fastreduce
