// A loss's gradient, computed in the forward, scaled in the backward by the
// incoming gradient: as the torch glue, the launcher and the CPU kernel see
// it. Nothing here depends on torch or CUDA.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fastreduce {

// data: rows x width contiguous elements of dtype, scaled by *factor (a value
// on data's device, of data's dtype when factor_of_data_type, else of its
// accumulator type) unless the factor is 1.
//
// With the loss's targets (target_count int64), what torch's backward never
// scales is left as the forward computed it (0, or NaN from non-finite
// inputs) whatever the incoming gradient, where 0 * inf would be NaN.
enum class Unscaled {
  kNothing,
  kIgnoredRows,       // a target a row: the rows whose target is ignore_index
  kAllWhenAllIgnored  // a weight's gradient (a sum over rows): all of it when no target counts
};

struct ScaleProblem {
  DType dtype;
  void* data;
  int64_t rows, width;
  const void* factor;
  bool factor_of_data_type;
  Unscaled unscaled = Unscaled::kNothing;
  const int64_t* target = nullptr;
  int64_t target_count = 0, ignore_index = -100;
};

}  // namespace fastreduce
