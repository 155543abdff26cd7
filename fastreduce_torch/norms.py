"""layer_norm, rms_norm, their fused residual-add forms, softmax and the
GPT-2 causal softmax: typed wrappers and fake kernels. Autograd (C++, csrc/torch/autograd.cpp) calls the registered
backward ops, so it traces under torch.compile and AOT autograd."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import _C
from ._eager import plain
from ._sharding import rules as sharding_rules

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_ops = torch.ops.fastreduce
_layer_norm, _softmax, _causal_softmax = _ops.layer_norm.default, _ops.softmax.default, _ops.causal_softmax.default
_rms_norm, _add_layer_norm, _add_rms_norm = _ops.rms_norm.default, _ops.add_layer_norm.default, _ops.add_rms_norm.default


def _shape(normalized_shape: int | Sequence[int]) -> Sequence[int]:
    return (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape


def _tensor_parallel(input: Tensor, normalized_dims: int) -> int | None:
    """The mesh dim of a DTensor sharded along its one normalised dim (the
    statistics-exchanging path of distributed.py), else None."""
    rules = sharding_rules()
    return rules.sharded_row_dim(input, normalized_dims) if rules is not None else None


def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Layer normalisation over the trailing ``normalized_shape`` dims, like
    :func:`torch.nn.functional.layer_norm`."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if plain(input):
        return _C.layer_norm(input, normalized_shape, weight, bias, eps)
    if (mesh_dim := _tensor_parallel(input, len(normalized_shape))) is not None:
        return sharding_rules().sharded_norm(input, mesh_dim, weight, bias, eps, centered=True)
    return _layer_norm(input, normalized_shape, weight, bias, eps)[0]


def rms_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """Root-mean-square normalisation over the trailing ``normalized_shape`` dims,
    like :func:`torch.nn.functional.rms_norm` (``eps=None``: the machine epsilon
    of float32, or of float64 for float64 input, as torch)."""
    if plain(input):
        return _C.rms_norm(input, _shape(normalized_shape), weight, eps)
    if (mesh_dim := _tensor_parallel(input, len(_shape(normalized_shape)))) is not None:
        if eps is None:
            eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
        return sharding_rules().sharded_norm(input, mesh_dim, weight, None, eps, centered=False)
    return _rms_norm(input, _shape(normalized_shape), weight, eps)[0]


def add_layer_norm(
    input: Tensor,
    residual: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor]:
    """The pre-norm residual step in one pass: returns
    ``(layer_norm(h), h)`` with ``h = input + residual`` (in the dtype torch's add
    would give, and rounded to it as the unfused add). The backward adds the
    gradient arriving at ``h`` in the same pass."""
    if plain(input) and plain(residual):
        return _C.add_layer_norm(input, residual, _shape(normalized_shape), weight, bias, eps)
    out, residual_out, _, _ = _add_layer_norm(input, residual, _shape(normalized_shape), weight, bias, eps)
    return out, residual_out


def add_rms_norm(
    input: Tensor,
    residual: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`add_layer_norm` with RMS normalisation: returns ``(rms_norm(h), h)``
    with ``h = input + residual``."""
    if plain(input) and plain(residual):
        return _C.add_rms_norm(input, residual, _shape(normalized_shape), weight, eps)
    out, residual_out, _ = _add_rms_norm(input, residual, _shape(normalized_shape), weight, eps)
    return out, residual_out


def softmax(input: Tensor, dim: int = -1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Softmax over ``dim``, like :func:`torch.softmax` (with ``dtype`` the input is
    cast first). A dim other than the last costs one transposing copy each way."""
    if plain(input):
        return _C.softmax(input, dim, dtype)
    if dim % max(input.dim(), 1) == input.dim() - 1 and (mesh_dim := _tensor_parallel(input, 1)) is not None:
        return sharding_rules().sharded_softmax(input if dtype is None else input.to(dtype), mesh_dim)
    return _softmax(input, dim, dtype=dtype)


def causal_softmax(scores: Tensor, scale: float = 1.0) -> Tensor:
    """The GPT-2 attention softmax of ``scores`` shaped ``(..., T, T)``: row ``t`` is
    ``softmax(scale * scores[..., t, :t+1])`` and every entry above the diagonal is
    exactly 0. Reads only the lower triangle."""
    if plain(scores):
        return _C.causal_softmax(scores, scale)
    return _causal_softmax(scores, scale)


# ---- fake kernels


def _check_floating(name: str, t: Tensor, argument: str) -> None:
    torch._check(t.dtype in FLOATING, lambda: f"{name}: unsupported dtype {t.dtype} for argument '{argument}'")


def _stats_dtype(input: Tensor, weight: Tensor | None, bias: Tensor | None, widen: bool = False) -> torch.dtype:
    mixed = any(p is not None and p.dtype != input.dtype for p in (weight, bias))
    widen = (widen or mixed or input.device.type == "cuda") and input.dtype != torch.float64
    return torch.float32 if widen else input.dtype


def _check_norm(name: str, input: Tensor, normalized_shape, residual: Tensor | None = None,
                **params: Tensor | None) -> list[int]:
    """The statistics' shape, after the kernels' checks of input, residual and
    the parameters (by name: weight, bias)."""
    _check_floating(name, input, "input")
    for argument, param in params.items():
        torch._check(
            param is None or list(param.shape) == list(normalized_shape),
            lambda: f"{name}: argument '{argument}' has shape {list(param.shape)}, expected {list(normalized_shape)}",
        )
    weight, bias = params.get("weight"), params.get("bias")
    torch._check(
        weight is None or bias is None or weight.dtype == bias.dtype,
        lambda: f"{name}: argument 'bias' has dtype {bias.dtype} but 'weight' has dtype {weight.dtype}",
    )
    k = len(normalized_shape)
    torch._check(
        k >= 1 and input.dim() >= k and list(input.shape[input.dim() - k:]) == list(normalized_shape),
        lambda: f"{name}: argument 'normalized_shape' is {list(normalized_shape)}, expected input with "
        f"shape [*, {list(normalized_shape)}], but got input of size {list(input.shape)}",
    )
    if residual is not None:
        torch._check(
            residual.shape == input.shape and residual.dtype in FLOATING,
            lambda: f"{name}: argument 'residual' must be floating with the shape of 'input'",
        )
    return list(input.shape[: input.dim() - k]) + [1] * k


def _promoted(input: Tensor, residual: Tensor) -> Tensor:
    """The rows the fused add normalises: input and residual promoted as torch's add."""
    return input.new_empty(input.shape, dtype=torch.promote_types(input.dtype, residual.dtype))


def _stats(input: Tensor, stats_shape: list[int], weight: Tensor | None, bias: Tensor | None = None,
           widen: bool = False) -> Tensor:
    return input.new_empty(stats_shape, dtype=_stats_dtype(input, weight, bias, widen))


def _param_grad(param: Tensor | None, input: Tensor) -> Tensor:
    return param.new_empty(param.shape) if param is not None else input.new_empty((0,))


@torch.library.register_fake("fastreduce::layer_norm")
def _layer_norm_fake(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    stats = _stats(input, _check_norm("layer_norm", input, normalized_shape, weight=weight, bias=bias), weight, bias)
    return input.new_empty(input.shape), stats, torch.empty_like(stats)


@torch.library.register_fake("fastreduce::layer_norm_backward")
def _layer_norm_backward_fake(grad_out, input, normalized_shape, mean, rstd, weight, bias, grad_residual=None):
    return input.new_empty(input.shape), _param_grad(weight, input), _param_grad(bias, input)


@torch.library.register_fake("fastreduce::rms_norm")
def _rms_norm_fake(input, normalized_shape, weight=None, eps=None):
    stats = _stats(input, _check_norm("rms_norm", input, normalized_shape, weight=weight), weight, widen=True)
    return input.new_empty(input.shape), stats


@torch.library.register_fake("fastreduce::rms_norm_backward")
def _rms_norm_backward_fake(grad_out, input, normalized_shape, rstd, weight, grad_residual=None):
    return input.new_empty(input.shape), _param_grad(weight, input)


@torch.library.register_fake("fastreduce::add_layer_norm")
def _add_layer_norm_fake(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    stats_shape = _check_norm("add_layer_norm", input, normalized_shape, residual, weight=weight, bias=bias)
    h = _promoted(input, residual)
    stats = _stats(h, stats_shape, weight, bias)
    return torch.empty_like(h), torch.empty_like(h), stats, torch.empty_like(stats)


@torch.library.register_fake("fastreduce::add_rms_norm")
def _add_rms_norm_fake(input, residual, normalized_shape, weight=None, eps=None):
    stats_shape = _check_norm("add_rms_norm", input, normalized_shape, residual, weight=weight)
    h = _promoted(input, residual)
    return torch.empty_like(h), torch.empty_like(h), _stats(h, stats_shape, weight, widen=True)


def _acc_dtype(input: Tensor) -> torch.dtype:
    return torch.float64 if input.dtype == torch.float64 else torch.float32


@torch.library.register_fake("fastreduce::_row_moments")
def _row_moments_fake(input):
    _check_floating("_row_moments", input, "input")
    torch._check(input.dim() >= 1, lambda: "_row_moments: argument 'input' must have at least one dimension")
    mean = input.new_empty(input.shape[:-1], dtype=_acc_dtype(input))
    return mean, torch.empty_like(mean)


@torch.library.register_fake("fastreduce::_normalize_rows")
def _normalize_rows_fake(input, mean, rstd, weight=None, bias=None):
    _check_floating("_normalize_rows", input, "input")
    torch._check(input.dim() >= 1, lambda: "_normalize_rows: argument 'input' must have at least one dimension")
    return input.new_empty(input.shape)


@torch.library.register_fake("fastreduce::softmax")
def _softmax_fake(self, dim=-1, *, dtype=None):
    out_dtype = dtype or self.dtype
    torch._check(out_dtype in FLOATING, lambda: f"softmax: unsupported dtype {out_dtype} for argument 'self'")
    torch._check(-max(self.dim(), 1) <= dim < max(self.dim(), 1), lambda: "softmax: dim out of range")
    return self.new_empty(self.shape, dtype=out_dtype)


@torch.library.register_fake("fastreduce::softmax_backward")
def _softmax_backward_fake(grad_output, output, dim):
    return output.new_empty(output.shape)


def _check_scores(scores: Tensor) -> None:
    _check_floating("causal_softmax", scores, "scores")
    torch._check(
        scores.dim() >= 2 and scores.shape[-1] == scores.shape[-2],
        lambda: f"causal_softmax: argument 'scores' must have shape (..., T, T), got {list(scores.shape)}",
    )


@torch.library.register_fake("fastreduce::causal_softmax")
def _causal_softmax_fake(scores, scale=1.0):
    _check_scores(scores)
    return scores.new_empty(scores.shape)


@torch.library.register_fake("fastreduce::causal_softmax_backward")
def _causal_softmax_backward_fake(grad_output, output, scale):
    return output.new_empty(output.shape)
