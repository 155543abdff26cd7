// Every operator, once: X(function, name, schema). `function` is the backend
// entry in ops.h (and call_<function> in dispatch.h), `name` the schema's
// operator name. registration.cpp defines the schemas and binds the backends
// to the CPU and CUDA keys from this list; dispatch.h makes the callers.
#pragma once

#define FASTREDUCE_OPERATORS(X)                                                                                    \
  X(sum, "sum", "sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")      \
  X(mean, "mean", "mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")   \
  X(prod, "prod", "prod(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")   \
  X(prod_backward, "prod_backward",                                                                                \
    "prod_backward(Tensor grad, Tensor self, Tensor result, int[1]? dim=None, bool keepdim=False) -> Tensor")      \
  X(amax, "amax", "amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor")                                 \
  X(amin, "amin", "amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor")                                 \
  X(var, "var", "var(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor")     \
  X(stddev, "std", "std(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor")  \
  X(var_mean, "var_mean",                                                                                          \
    "var_mean(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)") \
  X(stddev_mean, "std_mean",                                                                                       \
    "std_mean(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)") \
  X(logsumexp, "logsumexp", "logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor")                    \
  X(norm, "norm",                                                                                                  \
    "norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor")  \
  X(argmax, "argmax", "argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor")                           \
  X(argmin, "argmin", "argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor")                           \
  X(aminmax, "aminmax", "aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)")  \
  X(any, "any", "any(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor")                                 \
  X(all, "all", "all(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor")                                 \
  X(foreach_norm, "foreach_norm", "foreach_norm(Tensor[] tensors, Scalar ord=2) -> Tensor[]")                       \
  X(layer_norm, "layer_norm",                                                                                      \
    "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "   \
    "-> (Tensor, Tensor, Tensor)")                                                                                 \
  X(layer_norm_backward, "layer_norm_backward",                                                                    \
    "layer_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, "        \
    "Tensor? weight, Tensor? bias, Tensor? grad_residual=None) -> (Tensor, Tensor, Tensor)")                       \
  X(rms_norm, "rms_norm",                                                                                          \
    "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor, Tensor)")    \
  X(rms_norm_backward, "rms_norm_backward",                                                                        \
    "rms_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight, "       \
    "Tensor? grad_residual=None) -> (Tensor, Tensor)")                                                             \
  X(add_layer_norm, "add_layer_norm",                                                                              \
    "add_layer_norm(Tensor input, Tensor residual, int[] normalized_shape, Tensor? weight=None, "                  \
    "Tensor? bias=None, float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)")                                     \
  X(add_rms_norm, "add_rms_norm",                                                                                  \
    "add_rms_norm(Tensor input, Tensor residual, int[] normalized_shape, Tensor? weight=None, "                    \
    "float? eps=None) -> (Tensor, Tensor, Tensor)")                                                                \
  X(cross_entropy, "cross_entropy",                                                                                \
    "cross_entropy(Tensor input, Tensor target, str reduction=\"mean\", int ignore_index=-100, "                   \
    "float label_smoothing=0.0) -> (Tensor, Tensor)")                                                              \
  X(cross_entropy_backward, "cross_entropy_backward",                                                              \
    "cross_entropy_backward(Tensor grad_loss, Tensor? grad_lse, Tensor input, Tensor target, Tensor lse, "         \
    "str reduction, int ignore_index, float label_smoothing) -> Tensor")                                           \
  X(cross_entropy_backward_inplace, "_cross_entropy_backward_",                                                    \
    "_cross_entropy_backward_(Tensor(a!) input, Tensor grad_loss, Tensor? grad_lse, Tensor target, Tensor lse, "   \
    "str reduction, int ignore_index, float label_smoothing) -> ()")                                               \
  X(cross_entropy_with_grad, "_cross_entropy_with_grad",                                                          \
    "_cross_entropy_with_grad(Tensor input, Tensor target, str reduction, int ignore_index, "                      \
    "float label_smoothing) -> (Tensor loss, Tensor grad_input)")                                                  \
  X(cross_entropy_with_grad_inplace, "_cross_entropy_with_grad_",                                                  \
    "_cross_entropy_with_grad_(Tensor(a!) input, Tensor target, str reduction, int ignore_index, "                 \
    "float label_smoothing) -> Tensor loss")                                                                       \
  X(scale_unless_one, "_scale_unless_one_",                                                                        \
    "_scale_unless_one_(Tensor(a!) self, Tensor factor, Tensor? target=None, int ignore_index=-100, "              \
    "bool per_row=False) -> ()")                                                                                   \
  X(fused_linear_cross_entropy, "fused_linear_cross_entropy",                                                      \
    "fused_linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias=None, "                  \
    "str reduction=\"mean\", int ignore_index=-100, float label_smoothing=0.0, float? softcap=None) "              \
    "-> (Tensor loss, Tensor lse)")                                                                                \
  X(fused_linear_cross_entropy_with_grads, "_fused_linear_cross_entropy_with_grads",                                \
    "_fused_linear_cross_entropy_with_grads(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, "           \
    "str reduction, int ignore_index, float label_smoothing, float? softcap) "                                     \
    "-> (Tensor loss, Tensor lse, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")                      \
  X(fused_linear_cross_entropy_backward, "fused_linear_cross_entropy_backward",                                    \
    "fused_linear_cross_entropy_backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor target, "          \
    "Tensor? bias, Tensor lse, str reduction, int ignore_index, float label_smoothing, float? softcap) "           \
    "-> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)")                                               \
  X(row_moments, "_row_moments", "_row_moments(Tensor input) -> (Tensor mean, Tensor var)")                        \
  X(normalize_rows, "_normalize_rows",                                                                             \
    "_normalize_rows(Tensor input, Tensor? mean, Tensor rstd, Tensor? weight=None, Tensor? bias=None) -> Tensor")  \
  X(softmax, "softmax", "softmax(Tensor self, int dim=-1, *, ScalarType? dtype=None) -> Tensor")                    \
  X(softmax_backward, "softmax_backward", "softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor") \
  X(causal_softmax, "causal_softmax", "causal_softmax(Tensor scores, float scale=1.0) -> Tensor")                   \
  X(causal_softmax_backward, "causal_softmax_backward",                                                            \
    "causal_softmax_backward(Tensor grad_output, Tensor output, float scale) -> Tensor")                           \
  X(sum_variant, "sum_variant", "sum_variant(Tensor self, str variant) -> Tensor")                                 \
  X(read_probe, "_read_probe", "_read_probe(Tensor self) -> Tensor")
