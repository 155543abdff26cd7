// The target's extra term in a cross-entropy gradient row, shared by the CPU
// and CUDA kernels. Every element of the row gets soft * p_j - smooth, with
// smooth = g eps / classes; the target's element also loses `hit`, so that
// it totals g ((1 - eps) + eps / classes). hit is g (1 - eps), exact at eps 0
// and 1, except at one class: there the target is the whole row (p = 1, soft
// = g) and torch's gradient is exactly 0, which g - smooth gives; g (1 - eps)
// left an ulp of g (from huge g, an inf in the fused linear loss's weight
// gradient).
#pragma once

#include <cstdint>

#include "reduce_op.h"

namespace fastreduce {

template <typename A>
FR_HOST_DEVICE A target_hit(A g, A smoothing, int64_t classes, A smooth) {
  return classes == 1 ? g - smooth : g * (A(1) - smoothing);
}

}  // namespace fastreduce
