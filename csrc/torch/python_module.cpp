// The Python module fastreduce_torch._C: the kernel ladder's table, and a
// direct binding of each operator for the Python wrappers' eager path.
// torch.ops' generic call parses every argument against the schema and costs
// several µs more per call than aten's generated bindings; these call the
// same dispatcher entry (autocast, autograd, backends) with the arguments
// already typed. The wrappers use them only for plain tensors outside
// torch.compile and torch function modes (fastreduce_torch/_eager.py).
#include <torch/extension.h>

#include "../ladder/table.h"
#include "dispatch.h"

namespace py = pybind11;

namespace {

// dim as torch takes it: None, an int, or a sequence of ints.
std::optional<std::vector<int64_t>> dim_list(const py::handle& dim) {
  if (dim.is_none()) return std::nullopt;
  if (py::isinstance<py::int_>(dim)) return std::vector<int64_t>{dim.cast<int64_t>()};
  return dim.cast<std::vector<int64_t>>();
}

at::OptionalIntArrayRef as_ref(const std::optional<std::vector<int64_t>>& dims) {
  return dims.has_value() ? at::OptionalIntArrayRef(*dims) : at::OptionalIntArrayRef();
}

template <typename Caller>
at::Tensor reduction(Caller&& call, const at::Tensor& self, const py::handle& dim, bool keepdim,
                     std::optional<at::ScalarType> dtype) {
  const auto dims = dim_list(dim);
  return call(self, as_ref(dims), keepdim, dtype);
}

template <typename Caller>
at::Tensor extremum(Caller&& call, const at::Tensor& self, const py::handle& dim, bool keepdim) {
  const auto dims = dim_list(dim);
  return call(self, dims.has_value() ? at::IntArrayRef(*dims) : at::IntArrayRef(), keepdim);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  using fastreduce::kLadder;
  m.def("ladder", [] {
    py::list rows;
    for (int i = 0; i < fastreduce::kLadderSize; ++i)
      rows.append(py::make_tuple(kLadder[i].name, kLadder[i].summary, kLadder[i].deterministic));
    return rows;
  }, "The kernel ladder: (name, summary, deterministic).");

  m.def("sum", [](const at::Tensor& self, py::handle dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    return reduction([](auto&&... a) { return fastreduce::call_sum(a...); }, self, dim, keepdim, dtype);
  });
  m.def("mean", [](const at::Tensor& self, py::handle dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    return reduction([](auto&&... a) { return fastreduce::call_mean(a...); }, self, dim, keepdim, dtype);
  });
  m.def("prod", [](const at::Tensor& self, py::handle dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    return reduction([](auto&&... a) { return fastreduce::call_prod(a...); }, self, dim, keepdim, dtype);
  });
  m.def("amax", [](const at::Tensor& self, py::handle dim, bool keepdim) {
    return extremum([](auto&&... a) { return fastreduce::call_amax(a...); }, self, dim, keepdim);
  });
  m.def("amin", [](const at::Tensor& self, py::handle dim, bool keepdim) {
    return extremum([](auto&&... a) { return fastreduce::call_amin(a...); }, self, dim, keepdim);
  });
  m.def("layer_norm", [](const at::Tensor& input, std::vector<int64_t> normalized_shape,
                         std::optional<at::Tensor> weight, std::optional<at::Tensor> bias, double eps) {
    return std::get<0>(fastreduce::call_layer_norm(input, normalized_shape, weight, bias, eps));
  });
  m.def("rms_norm", [](const at::Tensor& input, std::vector<int64_t> normalized_shape,
                       std::optional<at::Tensor> weight, std::optional<double> eps) {
    return std::get<0>(fastreduce::call_rms_norm(input, normalized_shape, weight, eps));
  });
  m.def("add_layer_norm", [](const at::Tensor& input, const at::Tensor& residual,
                             std::vector<int64_t> normalized_shape, std::optional<at::Tensor> weight,
                             std::optional<at::Tensor> bias, double eps) {
    auto [out, residual_out, mean, rstd] =
        fastreduce::call_add_layer_norm(input, residual, normalized_shape, weight, bias, eps);
    return std::make_tuple(out, residual_out);
  });
  m.def("add_rms_norm", [](const at::Tensor& input, const at::Tensor& residual,
                           std::vector<int64_t> normalized_shape, std::optional<at::Tensor> weight,
                           std::optional<double> eps) {
    auto [out, residual_out, rstd] = fastreduce::call_add_rms_norm(input, residual, normalized_shape, weight, eps);
    return std::make_tuple(out, residual_out);
  });
  m.def("cross_entropy", [](const at::Tensor& input, const at::Tensor& target, const std::string& reduction,
                            int64_t ignore_index, double label_smoothing) {
    return fastreduce::call_cross_entropy(input, target, reduction, ignore_index, label_smoothing);
  });
  m.def("softmax", [](const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
    return fastreduce::call_softmax(self, dim, dtype);
  });
  m.def("causal_softmax", [](const at::Tensor& scores, double scale) {
    return fastreduce::call_causal_softmax(scores, scale);
  });
}
