"""sum, mean, prod, amax and amin: typed wrappers and fake kernels (autograd
and autocast are C++ kernels, csrc/torch/autograd.cpp and autocast.cpp)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import _C
from ._eager import plain

DimArg = int | Sequence[int] | None

SUPPORTED_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)


_ops = torch.ops.fastreduce
_sum, _mean, _prod, _amax, _amin = (_ops.sum.default, _ops.mean.default, _ops.prod.default, _ops.amax.default,
                                    _ops.amin.default)


def sum(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Sum of ``input`` over ``dim`` (all dims if None), like :func:`torch.sum`.

    Integer and bool inputs give int64 unless ``dtype`` is set; with ``dtype`` the
    input is cast first. Deterministic: the same input gives the same bits.
    """
    if plain(input):
        return _C.sum(input, dim, keepdim, dtype)
    return _sum(input, dim, keepdim, dtype=dtype)


def mean(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Mean of ``input`` over ``dim``, like :func:`torch.mean`; floating dtypes only
    (or an integer input with a floating ``dtype``). Empty reductions give NaN."""
    if plain(input):
        return _C.mean(input, dim, keepdim, dtype)
    return _mean(input, dim, keepdim, dtype=dtype)


def prod(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Product of ``input`` over ``dim``, like :func:`torch.prod` but taking a list of
    dims too. Integer and bool inputs give int64 unless ``dtype`` is set."""
    if plain(input):
        return _C.prod(input, dim, keepdim, dtype)
    return _prod(input, dim, keepdim, dtype=dtype)


def amax(input: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Maximum of ``input`` over ``dim`` (all dims if empty), like :func:`torch.amax`.
    NaN propagates; reducing a dim of size zero raises IndexError."""
    if plain(input):
        return _C.amax(input, dim, keepdim)
    return _amax(input, dim, keepdim)


def amin(input: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Minimum of ``input`` over ``dim`` (all dims if empty), like :func:`torch.amin`.
    NaN propagates; reducing a dim of size zero raises IndexError."""
    if plain(input):
        return _C.amin(input, dim, keepdim)
    return _amin(input, dim, keepdim)


# ---- fake kernels: shapes, dtypes and errors from torch's own meta functions,
# with a contiguous result like the real kernels produce.


def _check_dtype(name: str, dtype: torch.dtype, argument: str) -> None:
    torch._check(
        dtype in SUPPORTED_DTYPES,
        lambda: f"{name}: unsupported dtype {dtype} for argument '{argument}'",
    )


def _fake_like(reference: Tensor, self: Tensor) -> Tensor:
    return self.new_empty(reference.shape, dtype=reference.dtype)


def _torch_dims(dim: list[int] | None) -> list[int] | None:
    return dim if dim else None


@torch.library.register_fake("fastreduce::sum")
def _sum_fake(self, dim=None, keepdim=False, *, dtype=None):
    _check_dtype("sum", self.dtype, "self")
    return _fake_like(torch.sum(self, _torch_dims(dim), keepdim, dtype=dtype), self)


@torch.library.register_fake("fastreduce::prod")
def _prod_fake(self, dim=None, keepdim=False, *, dtype=None):
    # torch.prod takes one dim only; its output metadata follows sum's rules.
    _check_dtype("prod", self.dtype, "self")
    return _fake_like(torch.sum(self, _torch_dims(dim), keepdim, dtype=dtype), self)


@torch.library.register_fake("fastreduce::mean")
def _mean_fake(self, dim=None, keepdim=False, *, dtype=None):
    _check_dtype("mean", self.dtype, "self")
    return _fake_like(torch.mean(self, _torch_dims(dim), keepdim, dtype=dtype), self)


@torch.library.register_fake("fastreduce::amax")
def _amax_fake(self, dim=(), keepdim=False):
    _check_dtype("amax", self.dtype, "self")
    return _fake_like(torch.amax(self, dim, keepdim), self)


@torch.library.register_fake("fastreduce::amin")
def _amin_fake(self, dim=(), keepdim=False):
    _check_dtype("amin", self.dtype, "self")
    return _fake_like(torch.amin(self, dim, keepdim), self)


@torch.library.register_fake("fastreduce::prod_backward")
def _prod_backward_fake(grad, self, result, dim=None, keepdim=False):
    return self.new_empty(self.shape)
