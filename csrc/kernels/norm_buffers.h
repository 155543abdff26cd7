// One layer_norm or rms_norm call over contiguous (rows, n) data, as every
// layer sees it: the torch glue fills these, the launchers and the CPU
// kernels take them, the CUDA kernels' arguments extend them. Untyped (T, A
// void) above the kernels, typed in them: T the data, A the accumulator, P
// the weight and bias (T, or float beside float16/bfloat16 rows).
// Nothing here depends on torch or CUDA.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace fastreduce {

// The variants: Layer subtracts the row mean and may add a bias; Rms has
// neither. (Gemma's `1 + weight` is a float32 weight beside half input: no
// variant of its own.)
enum class NormKind : uint8_t { Layer, Rms };

struct NormShape {
  DType dtype;
  int64_t rows, n;
  NormKind kind;
  const char* op;  // the op's name, for errors
  // float32 weight and bias beside float16/bfloat16 rows (mixed precision),
  // read as they are: rounded to the rows' dtype they would add a rounding.
  bool float_params = false;
  bool centered() const { return kind == NormKind::Layer; }
};

// Each variant's math as the kernels see it (their `Math` parameter); a new
// variant is a NormKind, a policy here and its case in with_norm_math.
struct LayerNormMath {
  static constexpr bool kCentered = true;  // subtract the row mean; a bias
  // Deviations from a row's first value give its variance in one pass while
  // the mean lies within sqrt(kShiftedSpreadMax) deviations of that value:
  // E[(x - x0)^2] - (mean - x0)^2 then cancels at most log2(1 + 8) bits.
  // Beyond, a pass over the deviations from the mean corrects it.
  static constexpr float kShiftedSpreadMax = 8;
};
struct RmsNormMath {
  static constexpr bool kCentered = false;  // the mean taken as 0; no bias
};

// f(the policy of `kind`): where a NormKind meets its math, once.
template <typename F>
decltype(auto) with_norm_math(NormKind kind, F&& f) {
  if (kind == NormKind::Layer) return f(LayerNormMath{});
  return f(RmsNormMath{});
}

// Null pointers are absent. With `residual`, the rows normalised are
// h = x + residual, rounded to T as torch's add would, and h is written to
// `residual_out`. Statistics: `rows` each, in the accumulator type; mean for
// Layer only.
template <typename T = void, typename A = void, typename P = T>
struct NormForwardBuffers {
  const T* x;
  const T* residual;
  const P* weight;
  const P* bias;
  T* y;
  T* residual_out;
  A* mean;
  A* rstd;
};

// dx always; `grad_residual` (the gradient arriving at residual_out) is added
// to it, which is then the gradient of both inputs of the add. `x` is the
// rows that were normalised (h for the fused add).
template <typename T = void, typename A = void, typename P = T>
struct NormBackwardBuffers {
  const T* dy;
  const T* x;
  const T* grad_residual;
  const A* mean;
  const A* rstd;
  const P* weight;
  T* dx;
};

// The apply half of a norm from row statistics computed elsewhere (the
// ranks of a tensor-parallel group): y = (x - mean) * rstd * weight + bias;
// mean null for rms_norm.
template <typename T = void, typename A = void, typename P = T>
struct NormApplyBuffers {
  const T* x;
  const A* mean;
  const A* rstd;
  const P* weight;
  const P* bias;
  T* y;
};

// The weight and bias gradients (n each), when not null; each in the input's
// dtype where its flag says so (half parameters beside half input), else in
// the accumulator type.
struct NormParamGrads {
  void* dweight;
  void* dbias;
  bool dweight_in_input_type;
  bool dbias_in_input_type;
};

// f(TypeTag<P>{}) for the parameters' type P beside rows of T: float where
// the shape says so (two-byte rows only), T otherwise.
template <typename T, typename F>
decltype(auto) with_param_type(const NormShape& shape, F&& f) {
  if constexpr (sizeof(T) == 2)
    if (shape.float_params) return f(TypeTag<float>{});
  return f(TypeTag<T>{});
}

template <typename T, typename A, typename P = T>
NormForwardBuffers<T, A, P> typed(const NormForwardBuffers<>& b) {
  return {static_cast<const T*>(b.x),     static_cast<const T*>(b.residual), static_cast<const P*>(b.weight),
          static_cast<const P*>(b.bias),  static_cast<T*>(b.y),              static_cast<T*>(b.residual_out),
          static_cast<A*>(b.mean),        static_cast<A*>(b.rstd)};
}

template <typename T, typename A, typename P = T>
NormBackwardBuffers<T, A, P> typed(const NormBackwardBuffers<>& b) {
  return {static_cast<const T*>(b.dy),     static_cast<const T*>(b.x),    static_cast<const T*>(b.grad_residual),
          static_cast<const A*>(b.mean),   static_cast<const A*>(b.rstd), static_cast<const P*>(b.weight),
          static_cast<T*>(b.dx)};
}

template <typename T, typename A, typename P = T>
NormApplyBuffers<T, A, P> typed(const NormApplyBuffers<>& b) {
  return {static_cast<const T*>(b.x),      static_cast<const A*>(b.mean), static_cast<const A*>(b.rstd),
          static_cast<const P*>(b.weight), static_cast<const P*>(b.bias), static_cast<T*>(b.y)};
}

}  // namespace fastreduce
