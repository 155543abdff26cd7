#include "common.h"

namespace fastreduce {

std::string to_text(int64_t value) { return std::to_string(value); }

std::string to_text(at::IntArrayRef values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

std::string to_text(at::ScalarType type) { return std::string("torch.") + c10::toString(type); }

at::ScalarType acc_type(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::string to_text(const at::Device& device) { return device.str(); }

void check_same_device(const at::Tensor& t, const at::Tensor& reference, const char* op, const char* argument,
                       const char* reference_name) {
  TORCH_CHECK(t.device() == reference.device(), op, ": argument '", argument, "' is on ", to_text(t.device()), " but '",
              reference_name, "' is on ", to_text(reference.device()));
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TORCH_CHECK_INDEX(dim >= -n && dim < n, "Dimension out of range (expected to be in range of [", to_text(-n), ", ",
                    to_text(n - 1), "], but got ", to_text(dim), ")");
  return dim < 0 ? dim + n : dim;
}

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
    default: TORCH_CHECK(false, op, ": unsupported dtype ", to_text(type), " for argument 'self'");
  }
}


}  // namespace fastreduce
