#include "common.h"

namespace fastreduce {

DType to_dtype(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kBool: return DType::Bool;
    case at::kByte: return DType::UInt8;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kHalf: return DType::Half;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float;
    case at::kDouble: return DType::Double;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", type, " for argument 'self'");
  }
}

#ifndef FASTREDUCE_WITH_CUDA
void reduce_cuda(ReduceKind, const at::Tensor&, int64_t, int64_t, int64_t, at::Tensor&) {
  TORCH_CHECK(false, "fastreduce was built without CUDA (FASTREDUCE_CUDA=0)");
}
#endif

}  // namespace fastreduce
