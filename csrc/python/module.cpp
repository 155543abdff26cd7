// The Python module fastreduce_torch._C: the kernel ladder's table, and a
// direct binding of each operator for the Python wrappers' eager path.
// torch.ops' generic call parses every argument against the schema and costs
// several µs more per call than aten's generated bindings; these call the
// public C++ API (the same dispatcher entry: autocast, autograd, backends)
// with the arguments already typed. The wrappers use them only for plain
// tensors outside torch.compile and torch function modes
// (fastreduce_torch/_eager.py). The operators themselves live in
// libfastreduce_ops, which this module links and the package loads first.
#include <fastreduce/fastreduce.h>
#include <torch/extension.h>

#include "../ladder/table.h"

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

at::IntArrayRef as_list(const std::optional<std::vector<int64_t>>& dims) {
  return dims.has_value() ? at::IntArrayRef(*dims) : at::IntArrayRef();
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
    return fastreduce::sum(self, as_ref(dim_list(dim)), keepdim, dtype);
  });
  m.def("mean", [](const at::Tensor& self, py::handle dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    return fastreduce::mean(self, as_ref(dim_list(dim)), keepdim, dtype);
  });
  m.def("prod", [](const at::Tensor& self, py::handle dim, bool keepdim, std::optional<at::ScalarType> dtype) {
    return fastreduce::prod(self, as_ref(dim_list(dim)), keepdim, dtype);
  });
  m.def("amax", [](const at::Tensor& self, py::handle dim, bool keepdim) {
    return fastreduce::amax(self, as_list(dim_list(dim)), keepdim);
  });
  m.def("amin", [](const at::Tensor& self, py::handle dim, bool keepdim) {
    return fastreduce::amin(self, as_list(dim_list(dim)), keepdim);
  });
  // var, std, var_mean, std_mean: correction as torch takes it (None: 1).
  // Their degrees-of-freedom warning becomes a Python warning, as torch.var's
  // binding makes it (torch.ops leaves TORCH_WARN on stderr).
  auto moments = [&m](const char* name, auto* op) {
    m.def(name, [op](const at::Tensor& self, py::handle dim, std::optional<double> correction, bool keepdim) {
      torch::PyWarningHandler handler;
      const auto dims = dim_list(dim);
      return op(self, as_ref(dims), correction.has_value() ? std::optional<at::Scalar>(*correction) : std::nullopt,
                keepdim);
    });
  };
  moments("var", &fastreduce::var);
  moments("std", &fastreduce::std);
  moments("var_mean", &fastreduce::var_mean);
  moments("std_mean", &fastreduce::std_mean);
  m.def("layer_norm", &fastreduce::layer_norm);
  m.def("rms_norm", &fastreduce::rms_norm);
  m.def("add_layer_norm", &fastreduce::add_layer_norm);
  m.def("add_rms_norm", &fastreduce::add_rms_norm);
  m.def("cross_entropy", &fastreduce::cross_entropy_with_lse);
  m.def("cross_entropy_loss", &fastreduce::cross_entropy);
  m.def("softmax", &fastreduce::softmax);
  m.def("causal_softmax", &fastreduce::causal_softmax);
}
