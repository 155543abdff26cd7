// The one place where operators meet the dispatcher.
#include <torch/library.h>

#include "ops.h"

namespace backend = fastreduce::backend;

TORCH_LIBRARY(fastreduce, m) {
  m.def("sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("prod(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("prod_backward(Tensor grad, Tensor self, Tensor result, int[1]? dim=None, bool keepdim=False) -> Tensor");
  m.def("amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");
  m.def("amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor");
  m.def("var(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor");
  m.def("std(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor");
  m.def("var_mean(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)");
  m.def("std_mean(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)");
  m.def("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor");
  m.def("norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor");
  m.def("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor");
  m.def("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor");
  m.def("aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)");
  m.def("any(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor");
  m.def("all(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor");
  m.def("foreach_norm(Tensor[] tensors, Scalar ord=2) -> Tensor[]");
  m.def(
      "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, "
      "Tensor? weight, Tensor? bias, Tensor? grad_residual=None) -> (Tensor, Tensor, Tensor)");
  m.def("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor, Tensor)");
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight, "
      "Tensor? grad_residual=None) -> (Tensor, Tensor)");
  m.def(
      "add_layer_norm(Tensor input, Tensor residual, int[] normalized_shape, Tensor? weight=None, "
      "Tensor? bias=None, float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "add_rms_norm(Tensor input, Tensor residual, int[] normalized_shape, Tensor? weight=None, "
      "float? eps=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "cross_entropy(Tensor input, Tensor target, str reduction=\"mean\", int ignore_index=-100, "
      "float label_smoothing=0.0) -> (Tensor, Tensor)");
  m.def(
      "cross_entropy_backward(Tensor grad_loss, Tensor? grad_lse, Tensor input, Tensor target, Tensor lse, "
      "str reduction, int ignore_index, float label_smoothing) -> Tensor");
  m.def("_row_moments(Tensor input) -> (Tensor mean, Tensor var)");
  m.def(
      "_normalize_rows(Tensor input, Tensor? mean, Tensor rstd, Tensor? weight=None, Tensor? bias=None) "
      "-> Tensor");
  m.def("softmax(Tensor self, int dim=-1, *, ScalarType? dtype=None) -> Tensor");
  m.def("softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor");
  m.def("causal_softmax(Tensor scores, float scale=1.0) -> Tensor");
  m.def("causal_softmax_backward(Tensor grad_output, Tensor output, float scale) -> Tensor");
  m.def("sum_variant(Tensor self, str variant) -> Tensor");
  m.def("_read_probe(Tensor self) -> Tensor");
}

#define FASTREDUCE_IMPLS(m)                                                  \
  m.impl("sum", &backend::sum);                                              \
  m.impl("mean", &backend::mean);                                            \
  m.impl("prod", &backend::prod);                                            \
  m.impl("prod_backward", &backend::prod_backward);                          \
  m.impl("amax", &backend::amax);                                            \
  m.impl("amin", &backend::amin);                                            \
  m.impl("var", &backend::var);                                              \
  m.impl("std", &backend::stddev);                                           \
  m.impl("var_mean", &backend::var_mean);                                    \
  m.impl("std_mean", &backend::stddev_mean);                                 \
  m.impl("logsumexp", &backend::logsumexp);                                  \
  m.impl("norm", &backend::norm);                                            \
  m.impl("argmax", &backend::argmax);                                        \
  m.impl("argmin", &backend::argmin);                                        \
  m.impl("aminmax", &backend::aminmax);                                      \
  m.impl("any", &backend::any);                                              \
  m.impl("all", &backend::all);                                              \
  m.impl("foreach_norm", &backend::foreach_norm);                            \
  m.impl("layer_norm", &backend::layer_norm);                                \
  m.impl("layer_norm_backward", &backend::layer_norm_backward);              \
  m.impl("rms_norm", &backend::rms_norm);                                    \
  m.impl("rms_norm_backward", &backend::rms_norm_backward);                  \
  m.impl("add_layer_norm", &backend::add_layer_norm);                        \
  m.impl("add_rms_norm", &backend::add_rms_norm);                            \
  m.impl("cross_entropy", &backend::cross_entropy);                          \
  m.impl("cross_entropy_backward", &backend::cross_entropy_backward);        \
  m.impl("_row_moments", &backend::row_moments);                            \
  m.impl("_normalize_rows", &backend::normalize_rows);                      \
  m.impl("softmax", &backend::softmax);                                      \
  m.impl("softmax_backward", &backend::softmax_backward);                    \
  m.impl("causal_softmax", &backend::causal_softmax);                        \
  m.impl("causal_softmax_backward", &backend::causal_softmax_backward);      \
  m.impl("sum_variant", &backend::sum_variant);                              \
  m.impl("_read_probe", &backend::read_probe);

TORCH_LIBRARY_IMPL(fastreduce, CPU, m) { FASTREDUCE_IMPLS(m) }

#ifdef FASTREDUCE_WITH_CUDA
TORCH_LIBRARY_IMPL(fastreduce, CUDA, m) { FASTREDUCE_IMPLS(m) }
#endif

TORCH_LIBRARY_IMPL(fastreduce, Autograd, m) { fastreduce::register_autograd(m); }
TORCH_LIBRARY_IMPL(fastreduce, AutocastCUDA, m) { fastreduce::register_autocast_cuda(m); }
TORCH_LIBRARY_IMPL(fastreduce, AutocastCPU, m) { fastreduce::register_autocast_cpu(m); }
