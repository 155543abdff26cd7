// The reduction-op abstraction shared by every kernel, CUDA and CPU alike:
// an op is an identity, a combine and a finalize over its accumulator type.
// This header has no torch and no CUDA dependency so the CPU path can use it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dtype.h"

#if defined(__CUDACC__)
#define FR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FR_HOST_DEVICE inline
#endif

namespace fastreduce {

template <typename Acc>
struct SumOp {
  using acc_t = Acc;
  FR_HOST_DEVICE static Acc identity() { return Acc(0); }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a + b; }
  FR_HOST_DEVICE static Acc finalize(Acc a, Acc /*scale*/) { return a; }
};

// Like torch's MeanOps: a sum, multiplied by 1/count at the end.
template <typename Acc>
struct MeanOp : SumOp<Acc> {
  FR_HOST_DEVICE static Acc finalize(Acc a, Acc inv_count) { return a * inv_count; }
};

template <typename Acc>
struct ProdOp {
  using acc_t = Acc;
  FR_HOST_DEVICE static Acc identity() { return Acc(1); }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a * b; }
  FR_HOST_DEVICE static Acc finalize(Acc a, Acc /*scale*/) { return a; }
};

// amax/amin propagate NaN like torch: once a NaN is seen it wins. For
// integer types `a != a` is false and the checks fold away.
template <typename Acc>
struct MaxOp {
  using acc_t = Acc;
  FR_HOST_DEVICE static Acc identity() {
    return std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::lowest();
  }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
  FR_HOST_DEVICE static Acc finalize(Acc a, Acc /*scale*/) { return a; }
};

template <typename Acc>
struct MinOp {
  using acc_t = Acc;
  FR_HOST_DEVICE static Acc identity() {
    return std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::max();
  }
  FR_HOST_DEVICE static Acc combine(Acc a, Acc b) {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? a : b;
  }
  FR_HOST_DEVICE static Acc finalize(Acc a, Acc /*scale*/) { return a; }
};

enum class ReduceKind { Sum, Mean, Prod, Max, Min };

// Accumulator types: half types widen to float; sums and products of
// integers widen to int64 (torch's output type); max/min of narrow integers
// use int32, which the warp shuffle supports.
template <typename In, ReduceKind K>
struct AccType {
  static constexpr bool is_float = !std::numeric_limits<In>::is_integer;
  static constexpr bool wide_int = K == ReduceKind::Sum || K == ReduceKind::Prod;
  using type = typename std::conditional<
      is_float, typename std::conditional<sizeof(In) == 8, double, float>::type,
      typename std::conditional<wide_int || sizeof(In) == 8, int64_t, int32_t>::type>::type;
};

// The types of one reduction: op, accumulator, output (torch's: int64 for
// sums and products of integers and bools, the input type otherwise).
template <ReduceKind K, typename In>
struct ReduceTypes {
  using acc_t = typename AccType<In, K>::type;
  using out_t = std::conditional_t<(K == ReduceKind::Sum || K == ReduceKind::Prod) &&
                                       std::numeric_limits<In>::is_integer,
                                   int64_t, In>;
  using op_t = std::conditional_t<
      K == ReduceKind::Sum, SumOp<acc_t>,
      std::conditional_t<K == ReduceKind::Mean, MeanOp<acc_t>,
                         std::conditional_t<K == ReduceKind::Prod, ProdOp<acc_t>,
                                            std::conditional_t<K == ReduceKind::Max, MaxOp<acc_t>,
                                                               MinOp<acc_t>>>>>;
};

// Calls f(std::integral_constant<ReduceKind, K>{}, TypeTag<In>{}) for a runtime
// (kind, dtype); mean of an integer type is refused with `refused`.
template <typename Half, typename BFloat16, typename R, typename F>
R visit_reduction(ReduceKind kind, DType dtype, R refused, F&& f) {
  return visit_dtype<Half, BFloat16>(dtype, [&](auto tag) -> R {
    using In = typename decltype(tag)::type;
    using std::integral_constant;
    switch (kind) {
      case ReduceKind::Sum: return f(integral_constant<ReduceKind, ReduceKind::Sum>{}, tag);
      case ReduceKind::Prod: return f(integral_constant<ReduceKind, ReduceKind::Prod>{}, tag);
      case ReduceKind::Max: return f(integral_constant<ReduceKind, ReduceKind::Max>{}, tag);
      case ReduceKind::Min: return f(integral_constant<ReduceKind, ReduceKind::Min>{}, tag);
      default:
        if constexpr (std::numeric_limits<In>::is_integer) return refused;
        else return f(integral_constant<ReduceKind, ReduceKind::Mean>{}, tag);
    }
  });
}

}  // namespace fastreduce
