"""fastreduce: reduction, normalisation, softmax and cross-entropy operators for PyTorch.

Importing the package loads the compiled library, which registers the
``torch.ops.fastreduce`` operators, then their fake kernels and autograd.
"""

import torch  # noqa: F401  (the library links against torch: load it first)

from . import _C  # noqa: F401  (registers torch.ops.fastreduce.*)
from . import nn
from .ladder import ladder, sum_variant, variants
from .nn import patch
from .losses import cross_entropy
from .norms import add_layer_norm, add_rms_norm, causal_softmax, layer_norm, rms_norm, softmax
from .reductions import amax, amin, mean, prod, sum

__all__ = [
    "sum", "mean", "prod", "amax", "amin",
    "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "softmax", "causal_softmax",
    "cross_entropy", "nn", "patch",
    "sum_variant", "variants", "ladder",
]
