"""When the wrappers may take the direct bindings of fastreduce_torch._C.

Those bindings enter the same dispatcher as torch.ops.fastreduce (autocast,
autograd, dispatch modes and the kernels all run), without torch.ops' generic
argument parsing. They skip what only the torch.ops path does: tracing by
torch.compile/export, __torch_function__ of tensor subclasses and torch
function modes. So they are taken for plain tensors in eager code only.
"""

from torch import Tensor
from torch._C import _is_torch_function_mode_enabled
from torch.compiler import is_compiling


def plain(t) -> bool:
    return type(t) is Tensor and not is_compiling() and not _is_torch_function_mode_enabled()
