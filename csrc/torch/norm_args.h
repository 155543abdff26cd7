// Argument checks and parameter preparation shared by the norm ops
// (norms.cpp) and the halves of a split norm (split_norm.cpp).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace fastreduce {

// A float32/float64/float16/bfloat16 tensor, or an error naming `argument`.
void check_floating(const at::Tensor& t, const char* op, const char* argument);

bool is_half_type(at::ScalarType type);

// weight/bias: on input's device, of normalized_shape, the input's dtype or
// float32 beside half input, and one dtype for both.
void check_params(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                  const at::Tensor& input, at::IntArrayRef normalized_shape, const char* op);

const at::Tensor* defined_or_null(const std::optional<at::Tensor>& t);

// A parameter float32 beside half input (the one mix check_params allows).
bool has_float_param(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias);

// The parameter as the kernels take it: contiguous, in its own dtype; undefined for none.
at::Tensor kernel_param(const std::optional<at::Tensor>& t);

}  // namespace fastreduce
