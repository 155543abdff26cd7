// The CPU's scale_unless_one: the host reads the factor (no device to wait
// for) and scales in the accumulator type, one rounding to the data's.
#include <ATen/Parallel.h>

#include "../torch/kernels.h"
#include "vec.h"

namespace fastreduce {
namespace {

void scale_unless_one_cpu(DType dtype, void* data, int64_t count, const void* factor, bool factor_of_data_type) {
  cpu::with_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = at::opmath_type<T>;
    const A scale =
        factor_of_data_type ? static_cast<A>(*static_cast<const T*>(factor)) : *static_cast<const A*>(factor);
    if (scale == A(1)) return;
    T* x = static_cast<T*>(data);
    at::parallel_for(0, count, 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x[i] = static_cast<T>(static_cast<A>(x[i]) * scale);
    });
  });
}

}  // namespace

FASTREDUCE_REGISTER_KERNEL(scale_unless_one_stub, CPU, scale_unless_one_cpu);

}  // namespace fastreduce
