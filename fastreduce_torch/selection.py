"""argmax, argmin, aminmax, any and all: typed wrappers and fake kernels."""

from __future__ import annotations

import torch
from torch import Tensor

from .reductions import DimArg, _check_dtype, _fake_like

_ops = torch.ops.fastreduce


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum over ``dim`` (of the flattened input if None), like
    :func:`torch.argmax`: the first index among ties, a NaN counts as the maximum."""
    return _ops.argmax(input, dim, keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum over ``dim``, like :func:`torch.argmin` (see :func:`argmax`)."""
    return _ops.argmin(input, dim, keepdim)


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False):
    """``(min, max)`` over ``dim`` (all dims if None) from one read, like
    :func:`torch.aminmax`; NaN propagates to both."""
    return torch.return_types.aminmax(_ops.aminmax(input, dim=dim, keepdim=keepdim))


def any(input: Tensor, dim: DimArg = None, keepdim: bool = False) -> Tensor:
    """Whether any element over ``dim`` is non-zero, like :func:`torch.any` (bool
    result; uint8 for a uint8 input, as torch)."""
    return _ops.any(input, dim, keepdim)


def all(input: Tensor, dim: DimArg = None, keepdim: bool = False) -> Tensor:
    """Whether every element over ``dim`` is non-zero, like :func:`torch.all`."""
    return _ops.all(input, dim, keepdim)


@torch.library.register_fake("fastreduce::argmax")
def _argmax_fake(self, dim=None, keepdim=False):
    _check_dtype("argmax", self.dtype, "self")
    return _fake_like(torch.argmax(self, dim, keepdim), self)


@torch.library.register_fake("fastreduce::argmin")
def _argmin_fake(self, dim=None, keepdim=False):
    _check_dtype("argmin", self.dtype, "self")
    return _fake_like(torch.argmin(self, dim, keepdim), self)


@torch.library.register_fake("fastreduce::aminmax")
def _aminmax_fake(self, *, dim=None, keepdim=False):
    _check_dtype("aminmax", self.dtype, "self")
    low, high = torch.aminmax(self, dim=dim, keepdim=keepdim)
    return _fake_like(low, self), _fake_like(high, self)


def _logical_fake(name, torch_fn, self, dim, keepdim):
    _check_dtype(name, self.dtype, "self")
    return _fake_like(torch_fn(self, dim=dim, keepdim=keepdim), self)  # dim=[] reduces nothing, as torch


@torch.library.register_fake("fastreduce::any")
def _any_fake(self, dim=None, keepdim=False):
    return _logical_fake("any", torch.any, self, dim, keepdim)


@torch.library.register_fake("fastreduce::all")
def _all_fake(self, dim=None, keepdim=False):
    return _logical_fake("all", torch.all, self, dim, keepdim)
