#include "scale.h"

#include <algorithm>

#include "../kernels/ceil_div.h"
#include "../kernels/scale_kernels.cuh"
#include "rows.h"

namespace fastreduce {

// A grid-stride pass: one wave of blocks.
constexpr int kScaleThreads = 256, kScaleBlocksPerSm = 8;

cudaError_t scale_unless_one(const ScaleProblem& problem, int sm_count, cudaStream_t stream) {
  const int64_t n = problem.rows * problem.width;
  if (n == 0) return cudaSuccess;
  const int64_t wave = int64_t(sm_count) * kScaleBlocksPerSm;
  return rows::dispatch_floating(problem.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* data = static_cast<T*>(problem.data);
    auto launch = [&](auto vec, auto factor_tag) {
      constexpr int kVec = decltype(vec)::value;
      using F = typename decltype(factor_tag)::type;
      const auto* factor = static_cast<const F*>(problem.factor);
      const int64_t blocks = std::clamp<int64_t>(ceil_div(n / kVec, kScaleThreads), 1, wave);
      if (problem.unscaled == Unscaled::kIgnoredRows)
        scale_rows_unless_one_kernel<T, F, kVec><<<blocks, kScaleThreads, 0, stream>>>(
            data, problem.rows, problem.width, factor, problem.target, problem.ignore_index);
      else
        scale_unless_one_kernel<T, F, kVec><<<blocks, kScaleThreads, 0, stream>>>(
            data, n, factor, problem.unscaled == Unscaled::kAllWhenAllIgnored, problem.target, problem.target_count,
            problem.ignore_index);
      return cudaGetLastError();
    };
    auto with_factor = [&](auto vec) {
      if (problem.factor_of_data_type) return launch(vec, TypeTag<T>{});
      return launch(vec, TypeTag<opmath_t<T>>{});
    };
    // Packs need an aligned start; by rows, rows no narrower than a pack.
    constexpr int kPack = Vec16<T>::kSize;
    const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
                         (problem.unscaled != Unscaled::kIgnoredRows || problem.width >= kPack);
    if (aligned) return with_factor(std::integral_constant<int, kPack>{});
    return with_factor(std::integral_constant<int, 1>{});
  });
}

}  // namespace fastreduce
