// The one place where operators meet the dispatcher: every schema and its
// CPU and CUDA backend from operators.h, then autograd and autocast.
#include <torch/library.h>

#include "operators.h"
#include "ops.h"

#define FASTREDUCE_DEFINE(function, name, schema) m.def(schema);
#define FASTREDUCE_BACKEND(function, name, schema) m.impl(name, &fastreduce::backend::function);

TORCH_LIBRARY(fastreduce, m) { FASTREDUCE_OPERATORS(FASTREDUCE_DEFINE) }

TORCH_LIBRARY_IMPL(fastreduce, CPU, m) { FASTREDUCE_OPERATORS(FASTREDUCE_BACKEND) }

#ifdef FASTREDUCE_WITH_CUDA
TORCH_LIBRARY_IMPL(fastreduce, CUDA, m) { FASTREDUCE_OPERATORS(FASTREDUCE_BACKEND) }
#endif

TORCH_LIBRARY_IMPL(fastreduce, Autograd, m) { fastreduce::register_autograd(m); }
TORCH_LIBRARY_IMPL(fastreduce, AutocastCUDA, m) { fastreduce::register_autocast_cuda(m); }
TORCH_LIBRARY_IMPL(fastreduce, AutocastCPU, m) { fastreduce::register_autocast_cpu(m); }
