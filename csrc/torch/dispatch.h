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

// call_NAME(args...) calls torch.ops.fastreduce.NAME; the handle is looked up once.
#define FASTREDUCE_CALLER(name)                                                                      \
  template <typename... Args>                                                                        \
  decltype(auto) call_##name(Args&&... args) {                                                       \
    static const auto op = find_op<decltype(fastreduce::backend::name)>("fastreduce::" #name);                \
    return op.call(std::forward<Args>(args)...);                                                     \
  }

FASTREDUCE_CALLER(sum)
FASTREDUCE_CALLER(mean)
FASTREDUCE_CALLER(prod)
FASTREDUCE_CALLER(prod_backward)
FASTREDUCE_CALLER(amax)
FASTREDUCE_CALLER(amin)
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

}  // namespace fastreduce
