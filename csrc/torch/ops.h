// The operators' C++ entry points, device-independent; registration.cpp binds
// them to the schemas.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fastreduce {

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype);
at::Tensor mean(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor prod(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                std::optional<at::ScalarType> dtype);
at::Tensor amax(const at::Tensor& self, at::IntArrayRef dim, bool keepdim);
at::Tensor amin(const at::Tensor& self, at::IntArrayRef dim, bool keepdim);

at::Tensor sum_variant(const at::Tensor& self, c10::string_view variant);
at::Tensor read_probe(const at::Tensor& self);

}  // namespace fastreduce
