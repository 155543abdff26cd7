// Autocast for the operators whose aten counterparts autocast touches, with
// the same policies (ATen's autocast_mode.cpp), so a model keeps its output
// dtypes when fastreduce is swapped in:
//   CUDA: layer_norm, add_layer_norm, cross_entropy and logsumexp run in float32 (fp32;
//         add_layer_norm's residual_out too, where torch's unfused add would
//         keep the input dtype); rms_norm and add_rms_norm fall through, as
//         aten's rms_norm does (measured on torch 2.11); sum, prod and softmax take
//         dtype=float32 when none is given (fp32_set_opt_dtype), and
//         causal_softmax, a softmax without a dtype argument, likewise runs
//         in float32; norm takes dtype=float32 as aten's linalg_vector_norm.
//         mean, amax, amin, var/std, argmax/argmin, aminmax and any/all
//         fall through (not listed by aten).
//   CPU:  prod and cross_entropy run in float32 (fp32); the rest fall
//         through, as aten's do.
//   Both: fused_linear_cross_entropy's matmuls run in the autocast dtype, as
//         F.linear's (lower_precision_fp).
// Ops with no kernel here fall through to the next key.
#include <ATen/autocast_mode.h>

#include "dispatch.h"
#include "ops.h"

namespace fastreduce {
namespace {

using c10::DeviceType;

template <DeviceType Device>
struct AutocastOff {
  c10::impl::ExcludeDispatchKeyGuard guard{at::autocast::get_autocast_dispatch_key_from_device_type(Device)};
};

template <DeviceType Device>
at::Tensor to_float(const at::Tensor& t) {
  return at::autocast::cached_cast(at::kFloat, t, Device);
}

template <DeviceType Device>
std::optional<at::Tensor> to_float(const std::optional<at::Tensor>& t) {
  return at::autocast::cached_cast(at::kFloat, t, Device);
}

// fp32_set_opt_dtype: float32 unless the caller named a dtype, when the input
// is a floating tensor of the autocast device.
template <DeviceType Device>
std::optional<at::ScalarType> float_unless_given(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  if (dtype.has_value() || !at::autocast::is_autocast_eligible(self, Device)) return dtype;
  return at::kFloat;
}

template <DeviceType Device>
at::Tensor sum_autocast(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                        std::optional<at::ScalarType> dtype) {
  AutocastOff<Device> off;
  return call_sum(self, dim, keepdim, float_unless_given<Device>(self, dtype));
}

template <DeviceType Device>
at::Tensor prod_set_dtype_autocast(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                                   std::optional<at::ScalarType> dtype) {
  AutocastOff<Device> off;
  return call_prod(self, dim, keepdim, float_unless_given<Device>(self, dtype));
}

template <DeviceType Device>
at::Tensor prod_fp32_autocast(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype) {
  AutocastOff<Device> off;
  return call_prod(to_float<Device>(self), dim, keepdim, dtype);
}

template <DeviceType Device>
at::Tensor norm_autocast(const at::Tensor& self, const at::Scalar& ord, at::OptionalIntArrayRef dim, bool keepdim,
                         std::optional<at::ScalarType> dtype) {
  AutocastOff<Device> off;
  return call_norm(self, ord, dim, keepdim, float_unless_given<Device>(self, dtype));
}

template <DeviceType Device>
at::Tensor logsumexp_autocast(const at::Tensor& self, at::IntArrayRef dim, bool keepdim) {
  AutocastOff<Device> off;
  return call_logsumexp(to_float<Device>(self), dim, keepdim);
}

template <DeviceType Device>
at::Tensor softmax_autocast(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  AutocastOff<Device> off;
  return call_softmax(self, dim, float_unless_given<Device>(self, dtype));
}

template <DeviceType Device>
at::Tensor causal_softmax_autocast(const at::Tensor& scores, double scale) {
  AutocastOff<Device> off;
  return call_causal_softmax(to_float<Device>(scores), scale);
}

template <DeviceType Device>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_autocast(const at::Tensor& input,
                                                                   at::IntArrayRef normalized_shape,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps) {
  AutocastOff<Device> off;
  return call_layer_norm(to_float<Device>(input), normalized_shape, to_float<Device>(weight), to_float<Device>(bias),
                         eps);
}

template <DeviceType Device>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_autocast(
    const at::Tensor& input, const at::Tensor& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  AutocastOff<Device> off;
  return call_add_layer_norm(to_float<Device>(input), to_float<Device>(residual), normalized_shape,
                             to_float<Device>(weight), to_float<Device>(bias), eps);
}

template <DeviceType Device>
std::tuple<at::Tensor, at::Tensor> cross_entropy_autocast(const at::Tensor& input, const at::Tensor& target,
                                                          c10::string_view reduction, int64_t ignore_index,
                                                          double label_smoothing) {
  AutocastOff<Device> off;
  return call_cross_entropy(to_float<Device>(input), target, reduction, ignore_index, label_smoothing);
}

template <DeviceType Device>
std::tuple<at::Tensor, at::Tensor> cross_entropy_with_grad_autocast(
    const at::Tensor& input, const at::Tensor& target, c10::string_view reduction, int64_t ignore_index,
    double label_smoothing) {
  AutocastOff<Device> off;
  return call_cross_entropy_with_grad(to_float<Device>(input), target, reduction, ignore_index, label_smoothing);
}

}  // namespace

// As F.linear (lower_precision_fp): the matmuls run in the autocast dtype;
// the loss is computed in float32 inside the op.
template <DeviceType Device>
std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy_autocast(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    c10::string_view reduction, int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
  AutocastOff<Device> off;
  const auto low = at::autocast::get_lower_precision_fp_from_device_type(Device);
  return call_fused_linear_cross_entropy(at::autocast::cached_cast(low, hidden, Device),
                                         at::autocast::cached_cast(low, weight, Device), target,
                                         at::autocast::cached_cast(low, bias, Device), reduction, ignore_index,
                                         label_smoothing, softcap);
}

void register_autocast_cuda(torch::Library& m) {
  constexpr auto cuda = DeviceType::CUDA;
  m.impl("sum", &sum_autocast<cuda>);
  m.impl("prod", &prod_set_dtype_autocast<cuda>);
  m.impl("norm", &norm_autocast<cuda>);
  m.impl("logsumexp", &logsumexp_autocast<cuda>);
  m.impl("softmax", &softmax_autocast<cuda>);
  m.impl("causal_softmax", &causal_softmax_autocast<cuda>);
  m.impl("layer_norm", &layer_norm_autocast<cuda>);
  m.impl("add_layer_norm", &add_layer_norm_autocast<cuda>);
  m.impl("cross_entropy", &cross_entropy_autocast<cuda>);
  m.impl("_cross_entropy_with_grad", &cross_entropy_with_grad_autocast<cuda>);
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy_autocast<cuda>);
}

void register_autocast_cpu(torch::Library& m) {
  constexpr auto cpu = DeviceType::CPU;
  m.impl("prod", &prod_fp32_autocast<cpu>);
  m.impl("cross_entropy", &cross_entropy_autocast<cpu>);
  m.impl("_cross_entropy_with_grad", &cross_entropy_with_grad_autocast<cpu>);
  m.impl("fused_linear_cross_entropy", &fused_linear_cross_entropy_autocast<cpu>);
}

}  // namespace fastreduce
