// The one place where operators meet the dispatcher.
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

// Importing fastreduce_torch._C runs the registrations below; the module
// itself exposes nothing.
extern "C" PyObject* PyInit__C() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

TORCH_LIBRARY(fastreduce, m) {
  m.def("sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("prod(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");
  m.def("amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");
}

#define FASTREDUCE_IMPLS(m)          \
  m.impl("sum", &fastreduce::sum);   \
  m.impl("mean", &fastreduce::mean); \
  m.impl("prod", &fastreduce::prod); \
  m.impl("amax", &fastreduce::amax); \
  m.impl("amin", &fastreduce::amin);

TORCH_LIBRARY_IMPL(fastreduce, CPU, m) { FASTREDUCE_IMPLS(m) }

#ifdef FASTREDUCE_WITH_CUDA
TORCH_LIBRARY_IMPL(fastreduce, CUDA, m) { FASTREDUCE_IMPLS(m) }
#endif
