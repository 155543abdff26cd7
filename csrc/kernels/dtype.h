// Element types as the launchers see them, and the one switch that turns a
// runtime DType into a C++ type. The torch glue maps at::ScalarType onto
// DType; nothing here depends on torch or CUDA, so the CPU path shares it
// (with c10's half types where the CUDA path uses cuda_fp16's).
#pragma once

#include <cstdint>

namespace fastreduce {

enum class DType { Bool, UInt8, Int8, Int16, Int32, Int64, Half, BFloat16, Float, Double };

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the C++ type T of `dtype`.
template <typename Half, typename BFloat16, typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Bool: return f(TypeTag<bool>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
    case DType::Int8: return f(TypeTag<int8_t>{});
    case DType::Int16: return f(TypeTag<int16_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Half: return f(TypeTag<Half>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    case DType::Float: return f(TypeTag<float>{});
    default: return f(TypeTag<double>{});
  }
}

}  // namespace fastreduce
