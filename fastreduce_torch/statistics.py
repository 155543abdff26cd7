"""var, std, var_mean, std_mean, logsumexp, norm, foreach_norm and
clip_grad_norm_: typed wrappers and fake kernels (autograd and autocast are
C++ kernels, csrc/torch/autograd_statistics.cpp and autocast.cpp)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from . import _C
from ._eager import plain
from .reductions import DimArg, _check_dtype, _fake_like, _torch_dims

_ops = torch.ops.fastreduce


def var(input: Tensor, dim: DimArg = None, *, correction: float | None = None, keepdim: bool = False) -> Tensor:
    """Variance over ``dim`` (all dims if None), like :func:`torch.var`: divided by
    ``N - correction`` (default correction 1). One pass (Welford/Chan merging), so
    data with a large mean keeps its precision. Floating dtypes only."""
    if plain(input):
        return _C.var(input, dim, correction, keepdim)
    return _ops.var(input, dim, correction=correction, keepdim=keepdim)


def std(input: Tensor, dim: DimArg = None, *, correction: float | None = None, keepdim: bool = False) -> Tensor:
    """Standard deviation over ``dim``, like :func:`torch.std` (see :func:`var`)."""
    if plain(input):
        return _C.std(input, dim, correction, keepdim)
    return _ops.std(input, dim, correction=correction, keepdim=keepdim)


def var_mean(input: Tensor, dim: DimArg = None, *, correction: float | None = None,
             keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``(var, mean)`` from one pass, like :func:`torch.var_mean`."""
    if plain(input):
        return _C.var_mean(input, dim, correction, keepdim)
    return _ops.var_mean(input, dim, correction=correction, keepdim=keepdim)


def std_mean(input: Tensor, dim: DimArg = None, *, correction: float | None = None,
             keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` from one pass, like :func:`torch.std_mean`."""
    if plain(input):
        return _C.std_mean(input, dim, correction, keepdim)
    return _ops.std_mean(input, dim, correction=correction, keepdim=keepdim)


def logsumexp(input: Tensor, dim: int | Sequence[int], keepdim: bool = False) -> Tensor:
    """``log(sum(exp(input)))`` over ``dim`` in one pass with a running maximum, like
    :func:`torch.logsumexp`: -inf rows give -inf, an inf gives inf, NaN propagates.
    Integer inputs compute in the default float dtype."""
    return _ops.logsumexp(input, dim, keepdim)


def norm(input: Tensor, ord: float = 2, dim: DimArg = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> Tensor:
    """Vector norm over ``dim``, like :func:`torch.linalg.vector_norm` (ord 2, 1, inf,
    -inf, 0 or any other p). float16/bfloat16 squares and powers accumulate in
    float64, so large half values do not overflow."""
    return _ops.norm(input, ord, dim, keepdim, dtype=dtype)


def foreach_norm(tensors: Sequence[Tensor], ord: float = 2) -> list[Tensor]:
    """The ``ord`` norm of each tensor, like ``torch._foreach_norm``: float32, float16
    and bfloat16 CUDA tensors of any shapes in one pass over all of them (float32
    accumulators), the rest one by one."""
    return _ops.foreach_norm(list(tensors), ord)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scales the gradients of ``parameters`` in place so that their total norm is at
    most ``max_norm``, like :func:`torch.nn.utils.clip_grad_norm_`; returns the
    total norm before clipping. The per-tensor norms come from :func:`foreach_norm`."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm_type = float(norm_type)
    first_device = grads[0].device
    norms = foreach_norm(grads, norm_type)
    total = norm(torch.stack([n.to(first_device) for n in norms]), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot "
            "be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`")
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    by_device: dict[tuple, list[Tensor]] = {}
    for g in grads:
        by_device.setdefault((g.device, g.dtype), []).append(g)
    for (device, _), group in by_device.items():
        torch._foreach_mul_(group, coefficient.to(device))
    return total


# ---- fake kernels: shapes and dtypes from torch's own meta functions, with a
# contiguous result like the real kernels produce.


def _check_floating(name: str, self: Tensor) -> None:
    _check_dtype(name, self.dtype, "self")
    torch._check(self.dtype.is_floating_point,
                 lambda: f"{name}: std and var only support floating point and complex dtypes, got {self.dtype}")


def _moments_fake(name, torch_fn, self, dim, correction, keepdim):
    _check_floating(name, self)
    return torch_fn(self, _torch_dims(dim), correction=correction, keepdim=keepdim)


@torch.library.register_fake("fastreduce::var")
def _var_fake(self, dim=None, *, correction=None, keepdim=False):
    return _fake_like(_moments_fake("var", torch.var, self, dim, correction, keepdim), self)


@torch.library.register_fake("fastreduce::std")
def _std_fake(self, dim=None, *, correction=None, keepdim=False):
    return _fake_like(_moments_fake("std", torch.std, self, dim, correction, keepdim), self)


@torch.library.register_fake("fastreduce::var_mean")
def _var_mean_fake(self, dim=None, *, correction=None, keepdim=False):
    spread, mean = _moments_fake("var_mean", torch.var_mean, self, dim, correction, keepdim)
    return _fake_like(spread, self), _fake_like(mean, self)


@torch.library.register_fake("fastreduce::std_mean")
def _std_mean_fake(self, dim=None, *, correction=None, keepdim=False):
    spread, mean = _moments_fake("std_mean", torch.std_mean, self, dim, correction, keepdim)
    return _fake_like(spread, self), _fake_like(mean, self)


@torch.library.register_fake("fastreduce::logsumexp")
def _logsumexp_fake(self, dim, keepdim=False):
    _check_dtype("logsumexp", self.dtype, "self")
    dims = list(dim) if dim else list(range(self.dim()))
    return _fake_like(torch.logsumexp(self, dims, keepdim), self)


@torch.library.register_fake("fastreduce::norm")
def _norm_fake(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    _check_dtype("norm", self.dtype, "self")
    # torch's dtype rules and argument checks, on a stand-in with no empty
    # dimension: torch 2.11's meta refuses inf and negative orders of any
    # empty input, where the operator (as torch's eager) refuses only an
    # empty reduction.
    stand_in = self.new_empty([1] * self.dim())
    reference = torch.linalg.vector_norm(stand_in, ord, _torch_dims(dim), keepdim, dtype=dtype)
    reduced = set(range(self.dim())) if not dim else {d % max(self.dim(), 1) for d in dim}
    if (ord < 0 or math.isinf(ord)) and math.prod(self.shape[d] for d in reduced if d < self.dim()) == 0:
        raise RuntimeError(f"norm: cannot compute the {float(ord)} norm on an empty tensor because the operation "
                           "does not have an identity")
    # The shape from the dims: torch 2.11's meta keeps a reduced dim of size 1.
    shape = [1 if d in reduced else s for d, s in enumerate(self.shape)] if keepdim else \
        [s for d, s in enumerate(self.shape) if d not in reduced]
    return self.new_empty(shape, dtype=reference.dtype)


@torch.library.register_fake("fastreduce::foreach_norm")
def _foreach_norm_fake(tensors, ord=2):
    # A tensor of its own for each norm, as the kernel returns them.
    return [t.new_empty(()) for t in tensors]
