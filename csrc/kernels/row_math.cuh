// Device math of the row kernels in the accumulator type (float, or double
// for double input).
#pragma once

#include <cuda_runtime.h>

namespace fastreduce {

// Softmax works in base 2: inputs are multiplied by scale * log2(e) once, so
// each element costs one exp2 (a single MUFU.EX2 for float) after the max.
constexpr double kLog2e = 1.4426950408889634;
// Float: one MUFU.EX2; results below 2^-126 flush to 0, which a softmax
// term that small is anyway next to the row's largest (2^0).
__device__ __forceinline__ float exp2_acc(float v) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(v));
  return result;
}
__device__ __forceinline__ double exp2_acc(double v) { return exp2(v); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }
// The larger of two values, NaN where either is (torch's max): for float one
// instruction, as fmaxf, which drops a NaN instead.
__device__ __forceinline__ float max_or_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float result;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
  return result;
#else
  return isnan(a) || isnan(b) ? a + b : fmaxf(a, b);
#endif
}
__device__ __forceinline__ double max_or_nan(double a, double b) { return isnan(a) || isnan(b) ? a + b : fmax(a, b); }
// exp2(scale2 * v - top) in one FMA is exact up to top's own rounding, which
// shifts every exponent of the row alike and cancels in the normalisation,
// as long as that shift (at most half an ulp of top) keeps exp2 in range:
// |top| < 2^24 bounds it by 1. Rows beyond (and inf/NaN tops) subtract the
// maximum in natural units first, as torch does.
template <typename A>
__device__ __forceinline__ bool fma_shift_in_range(A top) {
  return fabs(top) < A(16777216);
}
// A sum of exponentials against a shift (a row's first value, not its
// largest) of at most 2^96: none of them is larger, and its reciprocal is a
// normal float.
constexpr float kShiftedSumMax = 0x1p96f;
// scale * x rounded on its own (never fused into a following subtraction),
// so the row's largest scaled value equals the max taken over them exactly.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
// exp(v - top) with v and top in natural units: the difference is taken
// first, so the maximum gives exactly exp(0) however large the values.
template <typename A>
__device__ __forceinline__ A exp_shifted(A v, A top) {
  return exp2_acc((v - top) * static_cast<A>(kLog2e));
}

// Sums of deviations from some value, and of their squares.
// Summed by SumOp like a number.
template <typename A>
struct Deviations {
  A squares;
  A sum;
  Deviations() = default;
  __host__ __device__ explicit constexpr Deviations(int zero) : squares(zero), sum(zero) {}
  __host__ __device__ constexpr Deviations(A squares, A sum) : squares(squares), sum(sum) {}
  __device__ void add(A d) {
    squares += d * d;
    sum += d;
  }
  __host__ __device__ friend Deviations operator+(const Deviations& a, const Deviations& b) {
    return {a.squares + b.squares, a.sum + b.sum};
  }
};

// The mean and variance of a row of n values, of which for_each(f) calls f
// on the ones this thread holds, with row_sum(v) summing v over the row.
// One reduction: the deviations from `shift`, a value common to the row (its
// first), and their squares, var = E[(x - shift)^2] - (mean - shift)^2, while
// (mean - shift)^2 <= spread_max * var. Otherwise (or where the sums are not
// finite) a second pass over the deviations from that mean, corrected by
// their sum (Chan, Golub and LeVeque): no cancellation against a mean far
// from the shift, and none from the rounding of the first pass's mean.
// `again` makes the second pass (for_each unless given): a kernel may take
// that rare pass from memory rather than keep its code beside the first.
template <typename A, typename ForEach, typename RowSum, typename Again>
__device__ __forceinline__ A row_variance(A shift, A spread_max, int64_t n, ForEach&& for_each, RowSum&& row_sum,
                                          A& mean, Again&& again) {
  const A count = static_cast<A>(n);
  Deviations<A> from_shift(0);
  for_each([&](A v) { from_shift.add(v - shift); });
  const Deviations<A> shifted = row_sum(from_shift);
  const A offset = shifted.sum / count;
  mean = shift + offset;
  const A variance = shifted.squares / count - offset * offset;
  if (offset * offset <= spread_max * variance) return variance;  // false for NaN
  Deviations<A> from_mean(0);
  again([&](A v) { from_mean.add(v - mean); });
  const Deviations<A> row = row_sum(from_mean);
  const A correction = row.sum / count;
  if (!isfinite(correction)) return row.squares / count;
  mean += correction;
  // Squares past the type's range leave the variance inf (rstd 0), as
  // torch's; inf - correction^2 could be inf - inf, and a NaN clamped to 0
  // would make rstd 1 / sqrt(eps).
  if (isinf(row.squares)) return row.squares;
  return max(row.squares / count - correction * correction, A(0));
}
template <typename A, typename ForEach, typename RowSum>
__device__ __forceinline__ A row_variance(A shift, A spread_max, int64_t n, ForEach&& for_each, RowSum&& row_sum,
                                          A& mean) {
  return row_variance(shift, spread_max, n, for_each, row_sum, mean, for_each);
}

// xhat = (v - mean) * rstd of a row. Where the output is a two-byte type,
// one fma, v * rstd - mean * rstd: its one more rounding (of mean * rstd,
// 2^-24 relative to |mean| / std, as the rounding of the mean itself) is far
// below the output's, and it saves an instruction an element: layer_norm
// bf16 rows in clusters 1-2% faster on the H100 (the staged 768-wide rows
// were not: they keep the subtraction). Exact for rms_norm's mean of 0.
template <typename T, typename A>
struct RowNormalizer {
  static constexpr bool kFused = sizeof(T) == 2;
  A rstd, offset;  // offset: -mean * rstd where kFused, else the mean
  __device__ RowNormalizer(A mean, A rstd) : rstd(rstd), offset(kFused ? -mean * rstd : mean) {}
  __device__ A operator()(A v) const {
    if constexpr (kFused) return fma(v, rstd, offset);
    else return (v - offset) * rstd;
  }
};

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return rsqrt(v); }

}  // namespace fastreduce
