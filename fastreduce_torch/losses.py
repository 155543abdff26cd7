"""The fused cross-entropy: typed wrapper and fake kernels. Autograd is C++
(csrc/torch/autograd.cpp) and calls the registered backward op."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C
from ._eager import plain
from .norms import FLOATING

_cross_entropy = torch.ops.fastreduce.cross_entropy.default
_REDUCTIONS = ("none", "mean", "sum")


def cross_entropy(
    input: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`torch.nn.functional.cross_entropy` for ``(N, C)`` logits and ``(N,)``
    int64 class indices, fused: the forward reads the logits once and never
    materialises probabilities, the backward writes the gradient in one more
    pass. With ``return_lse`` also returns each row's log-sum-exp (float32, or
    float64 for float64 logits), differentiable, for z-loss."""
    if plain(input):
        loss, lse = _C.cross_entropy(input, target, reduction, ignore_index, label_smoothing)
    else:
        loss, lse = _cross_entropy(input, target, reduction, ignore_index, label_smoothing)
    return (loss, lse) if return_lse else loss


def _check(name: str, input: Tensor, target: Tensor, reduction: str) -> None:
    torch._check(input.dtype in FLOATING, lambda: f"{name}: unsupported dtype {input.dtype} for argument 'input'")
    torch._check(input.dim() == 2, lambda: f"{name}: argument 'input' must be (N, C) logits, got {list(input.shape)}")
    torch._check(target.dtype == torch.int64, lambda: f"{name}: argument 'target' must hold int64 class indices")
    torch._check(
        target.dim() == 1 and target.shape[0] == input.shape[0],
        lambda: f"{name}: argument 'target' must have shape ({input.shape[0]},), got {list(target.shape)}",
    )
    torch._check(reduction in _REDUCTIONS, lambda: f"{name}: argument 'reduction' is '{reduction}'")


def _lse_dtype(input: Tensor) -> torch.dtype:
    return torch.float64 if input.dtype == torch.float64 else torch.float32


@torch.library.register_fake("fastreduce::cross_entropy")
def _cross_entropy_fake(input, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    _check("cross_entropy", input, target, reduction)
    loss = input.new_empty((input.shape[0],) if reduction == "none" else ())
    return loss, input.new_empty((input.shape[0],), dtype=_lse_dtype(input))


@torch.library.register_fake("fastreduce::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, grad_lse, input, target, lse, reduction, ignore_index, label_smoothing):
    _check("cross_entropy_backward", input, target, reduction)
    return input.new_empty(input.shape)
