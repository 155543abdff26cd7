#include "scale.h"

#include <algorithm>

#include "../kernels/ceil_div.h"
#include "../kernels/scale_kernels.cuh"
#include "rows.h"

namespace fastreduce {

// A grid-stride pass: one wave of blocks.
constexpr int kScaleThreads = 256, kScaleBlocksPerSm = 8;

cudaError_t scale_unless_one(DType dtype, void* data, int64_t n, const void* factor, bool factor_of_data_type,
                             int sm_count, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return rows::dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0;
    auto launch = [&](auto vec, auto factor_tag) {
      constexpr int kVec = decltype(vec)::value;
      using F = typename decltype(factor_tag)::type;
      const int64_t blocks = std::clamp<int64_t>(ceil_div(n / kVec, kScaleThreads), 1,
                                                 int64_t(sm_count) * kScaleBlocksPerSm);
      scale_unless_one_kernel<T, F, kVec>
          <<<blocks, kScaleThreads, 0, stream>>>(static_cast<T*>(data), n, static_cast<const F*>(factor));
      return cudaGetLastError();
    };
    auto with_factor = [&](auto vec) {
      if (factor_of_data_type) return launch(vec, TypeTag<T>{});
      return launch(vec, TypeTag<opmath_t<T>>{});
    };
    if (aligned) return with_factor(std::integral_constant<int, Vec16<T>::kSize>{});
    return with_factor(std::integral_constant<int, 1>{});
  });
}

}  // namespace fastreduce
