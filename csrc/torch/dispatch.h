// Calls of the fastreduce operators through the dispatcher, for the kernels
// that sit above the backends (autograd, autocast) and re-enter it below
// their own key.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "ops.h"

namespace fastreduce {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// call_NAME(args...) calls torch.ops.fastreduce.SCHEMA (the backend function
// NAME); the handle is looked up once.
#define FASTREDUCE_CALLER_AS(name, schema)                                                 \
  template <typename... Args>                                                              \
  decltype(auto) call_##name(Args&&... args) {                                             \
    static const auto op = find_op<decltype(fastreduce::backend::name)>("fastreduce::" #schema); \
    return op.call(std::forward<Args>(args)...);                                           \
  }
#define FASTREDUCE_CALLER(name) FASTREDUCE_CALLER_AS(name, name)

FASTREDUCE_CALLER(sum)
FASTREDUCE_CALLER(mean)
FASTREDUCE_CALLER(prod)
FASTREDUCE_CALLER(prod_backward)
FASTREDUCE_CALLER(amax)
FASTREDUCE_CALLER(amin)
FASTREDUCE_CALLER(var)
FASTREDUCE_CALLER_AS(stddev, std)
FASTREDUCE_CALLER(var_mean)
FASTREDUCE_CALLER_AS(stddev_mean, std_mean)
FASTREDUCE_CALLER(logsumexp)
FASTREDUCE_CALLER(norm)
FASTREDUCE_CALLER(argmax)
FASTREDUCE_CALLER(argmin)
FASTREDUCE_CALLER(aminmax)
FASTREDUCE_CALLER(any)
FASTREDUCE_CALLER(all)
FASTREDUCE_CALLER(foreach_norm)
FASTREDUCE_CALLER(layer_norm)
FASTREDUCE_CALLER(layer_norm_backward)
FASTREDUCE_CALLER(rms_norm)
FASTREDUCE_CALLER(rms_norm_backward)
FASTREDUCE_CALLER(add_layer_norm)
FASTREDUCE_CALLER(add_rms_norm)
FASTREDUCE_CALLER(cross_entropy)
FASTREDUCE_CALLER(cross_entropy_backward)
FASTREDUCE_CALLER(softmax)
FASTREDUCE_CALLER(softmax_backward)
FASTREDUCE_CALLER(causal_softmax)
FASTREDUCE_CALLER(causal_softmax_backward)

#undef FASTREDUCE_CALLER
#undef FASTREDUCE_CALLER_AS

}  // namespace fastreduce
