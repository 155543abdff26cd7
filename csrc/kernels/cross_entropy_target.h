// The target's extra term in a cross-entropy gradient row, shared by the CPU
// and CUDA kernels. Every element of the row gets soft * p_j - smooth, with
// smooth = g eps / classes; the target's element also loses `hit`, so that
// it totals g ((1 - eps) + eps / classes). Written as g - g eps (C - 1) / C -
// smooth rather than g (1 - eps): at one class the target is the whole row
// (p = 1, soft = g) and its gradient is then exactly soft - smooth - (g -
// smooth) = 0, as torch's, where g (1 - eps) left an ulp of g (and inf for
// huge g).
#pragma once

#include <cstdint>

#include "reduce_op.h"

namespace fastreduce {

template <typename A>
FR_HOST_DEVICE A target_hit(A g, A smoothing, int64_t classes, A smooth) {
  const A others = static_cast<A>(classes - 1) / static_cast<A>(classes);
  return (g - g * smoothing * others) - smooth;
}

}  // namespace fastreduce
