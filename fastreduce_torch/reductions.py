"""sum, mean, prod, amax and amin: typed wrappers, fake kernels and autograd."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

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


def _dim_list(dim: DimArg) -> list[int] | None:
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def sum(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Sum of ``input`` over ``dim`` (all dims if None), like :func:`torch.sum`.

    Integer and bool inputs give int64 unless ``dtype`` is set; with ``dtype`` the
    input is cast first. Deterministic: the same input gives the same bits.
    """
    return torch.ops.fastreduce.sum.default(input, _dim_list(dim), keepdim, dtype=dtype)


def mean(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Mean of ``input`` over ``dim``, like :func:`torch.mean`; floating dtypes only
    (or an integer input with a floating ``dtype``). Empty reductions give NaN."""
    return torch.ops.fastreduce.mean.default(input, _dim_list(dim), keepdim, dtype=dtype)


def prod(input: Tensor, dim: DimArg = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """Product of ``input`` over ``dim``, like :func:`torch.prod` but taking a list of
    dims too. Integer and bool inputs give int64 unless ``dtype`` is set."""
    return torch.ops.fastreduce.prod.default(input, _dim_list(dim), keepdim, dtype=dtype)


def amax(input: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Maximum of ``input`` over ``dim`` (all dims if empty), like :func:`torch.amax`.
    NaN propagates; reducing a dim of size zero raises IndexError."""
    return torch.ops.fastreduce.amax.default(input, _dim_list(dim), keepdim)


def amin(input: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Minimum of ``input`` over ``dim`` (all dims if empty), like :func:`torch.amin`.
    NaN propagates; reducing a dim of size zero raises IndexError."""
    return torch.ops.fastreduce.amin.default(input, _dim_list(dim), keepdim)


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


# ---- autograd: backward formulas in plain torch ops, so they trace under
# torch.compile and AOT autograd.


def _reduced_dims(ndim: int, dim: list[int] | None) -> list[int]:
    if not dim:
        return list(range(ndim))
    return sorted(d % ndim if ndim else 0 for d in dim)


def _setup(ctx, inputs, output, keyword_only_inputs=None):
    self, dim = inputs[0], inputs[1]
    keepdim = inputs[2] if len(inputs) > 2 else False
    ctx.dims = _reduced_dims(self.dim(), dim)
    ctx.keepdim = keepdim
    ctx.input_shape = self.shape
    ctx.input_dtype = self.dtype


def _broadcast_back(ctx, grad: Tensor) -> Tensor:
    """grad of the output, reshaped to broadcast against the input."""
    if not ctx.keepdim and ctx.input_shape:
        for d in ctx.dims:
            grad = grad.unsqueeze(d)
    return grad


def _sum_backward(ctx, grad):
    return _broadcast_back(ctx, grad).expand(ctx.input_shape).to(ctx.input_dtype), None, None


def _mean_backward(ctx, grad):
    count = 1
    for d in ctx.dims:
        count = count * ctx.input_shape[d]
    return (_broadcast_back(ctx, grad) / count).expand(ctx.input_shape).to(ctx.input_dtype), None, None


def _setup_saving_input(ctx, inputs, output, keyword_only_inputs=None):
    _setup(ctx, inputs, output)
    ctx.save_for_backward(inputs[0], output)


def _product_of_others(x: Tensor, dims: list[int]) -> Tensor:
    """For each element, the product of the other elements of its reduction
    (exclusive cumulative products from both ends), exact even with zeros."""
    if x.dim() == 0:
        return torch.ones_like(x)
    kept = [d for d in range(x.dim()) if d not in dims]
    order = kept + dims
    permuted = x.permute(order)
    flat = permuted.reshape(*permuted.shape[: len(kept)], -1)
    ones = torch.ones_like(flat[..., :1])
    before = torch.cat([ones, flat[..., :-1]], -1).cumprod(-1)
    after = torch.cat([flat[..., 1:], ones], -1).flip(-1).cumprod(-1).flip(-1)
    inverse = [order.index(d) for d in range(x.dim())]
    return (before * after).reshape(permuted.shape).permute(inverse)


def _prod_backward(ctx, grad):
    x, _ = ctx.saved_tensors
    others = _product_of_others(x.to(grad.dtype), ctx.dims)
    return (_broadcast_back(ctx, grad) * others).to(ctx.input_dtype), None, None


def _extremum_backward(ctx, grad):
    # Ties share the gradient evenly, as in torch.
    x, out = ctx.saved_tensors
    ties = (x == _broadcast_back(ctx, out)).to(grad.dtype)
    count = ties.sum(ctx.dims, keepdim=True) if ctx.input_shape else ties
    return _broadcast_back(ctx, grad) * ties / count, None, None


torch.library.register_autograd("fastreduce::sum", _sum_backward, setup_context=_setup)
torch.library.register_autograd("fastreduce::mean", _mean_backward, setup_context=_setup)
torch.library.register_autograd("fastreduce::prod", _prod_backward, setup_context=_setup_saving_input)
torch.library.register_autograd("fastreduce::amax", _extremum_backward, setup_context=_setup_saving_input)
torch.library.register_autograd("fastreduce::amin", _extremum_backward, setup_context=_setup_saving_input)
