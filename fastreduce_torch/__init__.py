"""fastreduce: reduction, normalisation, softmax and cross-entropy operators for PyTorch.

Importing the package checks that it was built for the installed torch, loads
the operator library ``libfastreduce_ops.so`` (the ``torch.ops.fastreduce``
operators, their kernels, autograd and autocast; the same library C++
programs link), then the Python module with the eager bindings, and
registers the fake kernels.
"""

import os

from . import _library  # noqa: F401  (first: checks the torch build, loads libfastreduce_ops)
from . import _C  # noqa: F401
from . import nn
from .ladder import ladder, sum_variant, variants
from .nn import patch
from .lazy_logits import LazyLogits
from .losses import cross_entropy, fused_linear_cross_entropy
from .norms import add_layer_norm, add_rms_norm, causal_softmax, layer_norm, rms_norm, softmax
from .reductions import amax, amin, mean, prod, sum
from .selection import all, aminmax, any, argmax, argmin
from .statistics import clip_grad_norm_, foreach_norm, logsumexp, norm, std, std_mean, var, var_mean
from ._sharding import register_when_dtensor_imported

register_when_dtensor_imported()

#: Folder for CMake's find_package(fastreduce) (C++ programs linking the operators).
cmake_prefix_path = os.path.join(os.path.dirname(__file__), "share", "cmake")

__all__ = [
    "sum", "mean", "prod", "amax", "amin",
    "var", "std", "var_mean", "std_mean", "logsumexp", "norm", "argmax", "argmin", "aminmax", "any", "all",
    "foreach_norm", "clip_grad_norm_",
    "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "softmax", "causal_softmax",
    "cross_entropy", "fused_linear_cross_entropy", "LazyLogits", "nn", "patch",
    "sum_variant", "variants", "ladder",
]
