// Calls of the fastreduce operators through the dispatcher, for the kernels
// that sit above the backends (autograd, autocast) and the public C++ API.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "operators.h"
#include "ops.h"

namespace fastreduce {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// call_FUNCTION(args...) calls torch.ops.fastreduce.NAME (whose backend is
// backend::FUNCTION); the handle is looked up once.
#define FASTREDUCE_CALLER(function, name, schema)                                                  \
  template <typename... Args>                                                                      \
  decltype(auto) call_##function(Args&&... args) {                                                 \
    static const auto op = find_op<decltype(fastreduce::backend::function)>("fastreduce::" name); \
    return op.call(std::forward<Args>(args)...);                                                   \
  }
FASTREDUCE_OPERATORS(FASTREDUCE_CALLER)
#undef FASTREDUCE_CALLER

}  // namespace fastreduce
