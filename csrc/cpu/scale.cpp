// The CPU's scale_unless_one: the host reads the factor (no device to wait
// for) and scales in the accumulator type, one rounding to the data's.
#include <ATen/Parallel.h>

#include <algorithm>

#include "../torch/kernels.h"
#include "vec.h"

namespace fastreduce {
namespace {

void scale_unless_one_cpu(const ScaleProblem& problem) {
  cpu::with_floating(problem.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = at::opmath_type<T>;
    const A scale = problem.factor_of_data_type ? static_cast<A>(*static_cast<const T*>(problem.factor))
                                                : *static_cast<const A*>(problem.factor);
    if (scale == A(1)) return;
    auto scale_range = [scale](T* x, int64_t count) {
      for (int64_t i = 0; i < count; ++i) x[i] = static_cast<T>(static_cast<A>(x[i]) * scale);
    };
    T* data = static_cast<T*>(problem.data);
    const int64_t width = problem.width;
    const int64_t* target = problem.target;
    auto counts = [&](int64_t t) { return t != problem.ignore_index; };
    if (problem.unscaled == Unscaled::kIgnoredRows) {
      at::parallel_for(0, problem.rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t row = begin; row < end; ++row)
                           if (counts(target[row])) scale_range(data + row * width, width);
                       });
      return;
    }
    if (problem.unscaled == Unscaled::kAllWhenAllIgnored && std::none_of(target, target + problem.target_count, counts))
      return;
    at::parallel_for(0, problem.rows * width, 32768,
                     [&](int64_t begin, int64_t end) { scale_range(data + begin, end - begin); });
  });
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(scale_unless_one_stub, CPU, scale_unless_one_cpu);

}  // namespace fastreduce
