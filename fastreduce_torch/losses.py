"""The fused cross-entropy: typed wrapper and fake kernels. Autograd is in
C++ (csrc/torch/autograd.cpp): when the loss (mean or sum) will be
differentiated, its gradient comes from the forward's one read of the logits
(_cross_entropy_with_grad) and the backward only scales it; with
``inplace_backward`` and a lse to differentiate, a Python autograd function
writes the backward's gradient over the logits."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C
from ._eager import plain
from .norms import FLOATING

_cross_entropy = torch.ops.fastreduce.cross_entropy.default
_cross_entropy_with_grad = torch.ops.fastreduce._cross_entropy_with_grad.default
_cross_entropy_with_grad_ = torch.ops.fastreduce._cross_entropy_with_grad_.default
_REDUCTIONS = ("none", "mean", "sum")


def cross_entropy(
    input: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    return_lse: bool = False,
    inplace_backward: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`torch.nn.functional.cross_entropy` for ``(N, C)`` logits and ``(N,)``
    int64 class indices, fused: the forward reads the logits once and never
    materialises probabilities. When the loss (reduction mean or sum) will be
    differentiated, the same read also writes its gradient, which autograd
    holds instead of the logits; the backward scales it by the incoming
    gradient (not at all when that is 1). With ``return_lse`` also returns
    each row's log-sum-exp (float32, or float64 for float64 logits),
    differentiable, for z-loss; the gradient then comes in the backward. With
    ``inplace_backward`` (contiguous logits) the gradient is written over the
    logits instead of a new tensor: one logits-sized buffer less, for callers
    that no longer need the logits after the loss."""
    if not (return_lse or inplace_backward) and plain(input):
        # The binding itself takes the gradient-in-the-forward path when the loss will be differentiated.
        return _C.cross_entropy_loss(input, target, reduction, ignore_index, label_smoothing)
    wants_grad = input.requires_grad and torch.is_grad_enabled()
    if wants_grad and reduction in ("mean", "sum") and not return_lse and type(input) is Tensor:
        # Autocast runs cross_entropy in float32, as torch: over a copy, so
        # the gradient cannot go into the logits' own storage.
        upcast = input.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(input.device.type)
        if inplace_backward and input.is_contiguous() and not upcast:
            return _cross_entropy_with_grad_(input, target, reduction, ignore_index, label_smoothing)
        return _cross_entropy_with_grad(input, target, reduction, ignore_index, label_smoothing)[0]
    if inplace_backward and wants_grad and input.is_contiguous():
        loss, lse = _CrossEntropyInplaceBackward.apply(input, target, reduction, ignore_index, label_smoothing)
    elif plain(input):
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


@torch.library.register_fake("fastreduce::_cross_entropy_backward_")
def _cross_entropy_backward_inplace_fake(input, grad_loss, grad_lse, target, lse, reduction, ignore_index,
                                         label_smoothing):
    _check("_cross_entropy_backward_", input, target, reduction)
    torch._check(input.is_contiguous(), lambda: "_cross_entropy_backward_: argument 'input' must be contiguous")


@torch.library.register_fake("fastreduce::_cross_entropy_with_grad")
def _cross_entropy_with_grad_fake(input, target, reduction, ignore_index, label_smoothing):
    _check("_cross_entropy_with_grad", input, target, reduction)
    torch._check(reduction != "none", lambda: "_cross_entropy_with_grad: needs reduction 'mean' or 'sum'")
    loss, _ = _cross_entropy_fake(input, target, reduction, ignore_index, label_smoothing)
    return loss, torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fastreduce::_cross_entropy_with_grad_")
def _cross_entropy_with_grad_inplace_fake(input, target, reduction, ignore_index, label_smoothing):
    _check("_cross_entropy_with_grad_", input, target, reduction)
    torch._check(reduction != "none", lambda: "_cross_entropy_with_grad_: needs reduction 'mean' or 'sum'")
    torch._check(input.is_contiguous(), lambda: "_cross_entropy_with_grad_: argument 'input' must be contiguous")
    return _cross_entropy_fake(input, target, reduction, ignore_index, label_smoothing)[0]


@torch.library.register_fake("fastreduce::_scale_unless_one_")
def _scale_unless_one_fake(self, factor, target=None, ignore_index=-100, per_row=False):
    torch._check(factor.numel() == 1, lambda: "_scale_unless_one_: argument 'factor' must hold one element")
    if target is not None:
        torch._check(target.dtype == torch.int64, lambda: "_scale_unless_one_: argument 'target' must hold int64")
        torch._check(target.dim() == 1, lambda: "_scale_unless_one_: argument 'target' must be 1-D")
    if per_row:
        torch._check(target is not None, lambda: "_scale_unless_one_: argument 'per_row' needs argument 'target'")
        torch._check(
            self.dim() >= 1 and self.size(0) == target.size(0),
            lambda: "_scale_unless_one_: argument 'target' must hold one element a row of 'self'",
        )


class _CrossEntropyInplaceBackward(torch.autograd.Function):
    """cross_entropy whose backward writes the gradient over the saved logits."""

    @staticmethod
    def forward(ctx, input, target, reduction, ignore_index, label_smoothing):
        loss, lse = _cross_entropy(input, target, reduction, ignore_index, label_smoothing)
        ctx.save_for_backward(input, target, lse)
        ctx.options = (reduction, ignore_index, label_smoothing)
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, grad_lse):
        input, target, lse = ctx.saved_tensors
        reduction, ignore_index, label_smoothing = ctx.options
        if grad_loss is None:
            grad_loss = input.new_zeros((input.shape[0],) if reduction == "none" else (), dtype=lse.dtype)
        torch.ops.fastreduce._cross_entropy_backward_(input, grad_loss, grad_lse, target, lse, reduction,
                                                      ignore_index, label_smoothing)
        return input.detach(), None, None, None, None


_fused_linear_cross_entropy = torch.ops.fastreduce.fused_linear_cross_entropy.default


def fused_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
) -> Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, target)`` without ever holding
    the (tokens, vocab) logits: rows go through in chunks, each chunk's logits
    made by matmul, its loss and (when a gradient is wanted) its logit gradient
    computed, then dropped. ``hidden`` is ``(..., H)`` and ``target`` the matching
    ``(...)`` class indices. ``softcap`` caps the logits as
    ``softcap * tanh(logits / softcap)`` first (Gemma 2). The loss is in float32
    (float64 for float64 input), as the upcast logits of transformers' loss give."""
    hidden2d = hidden.reshape(-1, hidden.shape[-1])
    loss, _ = _fused_linear_cross_entropy(hidden2d, weight, target.reshape(-1), bias, reduction, ignore_index,
                                          label_smoothing, softcap)
    return loss.view(target.shape) if reduction == "none" else loss


def _check_linear(name: str, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
                  reduction: str) -> None:
    torch._check(hidden.dtype in FLOATING, lambda: f"{name}: unsupported dtype {hidden.dtype} for argument 'hidden'")
    torch._check(hidden.dim() == 2, lambda: f"{name}: argument 'hidden' must be (N, H), got {list(hidden.shape)}")
    torch._check(weight.dim() == 2 and weight.shape[1] == hidden.shape[1],
                 lambda: f"{name}: argument 'weight' must be (V, {hidden.shape[1]}), got {list(weight.shape)}")
    torch._check(weight.dtype == hidden.dtype, lambda: f"{name}: argument 'weight' is {weight.dtype}, 'hidden' {hidden.dtype}")
    torch._check(target.dtype == torch.int64, lambda: f"{name}: argument 'target' must hold int64 class indices")
    torch._check(target.dim() == 1 and target.shape[0] == hidden.shape[0],
                 lambda: f"{name}: argument 'target' must have shape ({hidden.shape[0]},), got {list(target.shape)}")
    torch._check(bias is None or (bias.dim() == 1 and bias.shape[0] == weight.shape[0]),
                 lambda: f"{name}: argument 'bias' must have shape ({weight.shape[0]},)")
    torch._check(reduction in _REDUCTIONS, lambda: f"{name}: argument 'reduction' is '{reduction}'")


def _linear_outputs(hidden: Tensor, reduction: str) -> tuple[Tensor, Tensor]:
    acc = _lse_dtype(hidden)
    loss = hidden.new_empty((hidden.shape[0],) if reduction == "none" else (), dtype=acc)
    return loss, hidden.new_empty((hidden.shape[0],), dtype=acc)


@torch.library.register_fake("fastreduce::fused_linear_cross_entropy")
def _fused_linear_cross_entropy_fake(hidden, weight, target, bias=None, reduction="mean", ignore_index=-100,
                                     label_smoothing=0.0, softcap=None):
    _check_linear("fused_linear_cross_entropy", hidden, weight, target, bias, reduction)
    return _linear_outputs(hidden, reduction)


@torch.library.register_fake("fastreduce::_fused_linear_cross_entropy_with_grads")
def _fused_linear_cross_entropy_with_grads_fake(hidden, weight, target, bias, reduction, ignore_index,
                                                label_smoothing, softcap):
    _check_linear("fused_linear_cross_entropy", hidden, weight, target, bias, reduction)
    torch._check(reduction != "none", lambda: "fused_linear_cross_entropy: gradients in the forward need 'mean' or 'sum'")
    loss, lse = _linear_outputs(hidden, reduction)
    grad_bias = weight.new_empty((weight.shape[0],) if bias is not None else (0,))
    return loss, lse, torch.empty_like(hidden, memory_format=torch.contiguous_format), \
        torch.empty_like(weight, memory_format=torch.contiguous_format), grad_bias


@torch.library.register_fake("fastreduce::fused_linear_cross_entropy_backward")
def _fused_linear_cross_entropy_backward_fake(grad_loss, hidden, weight, target, bias, lse, reduction, ignore_index,
                                              label_smoothing, softcap):
    _check_linear("fused_linear_cross_entropy_backward", hidden, weight, target, bias, reduction)
    grad_bias = weight.new_empty((weight.shape[0],) if bias is not None else (0,))
    return torch.empty_like(hidden, memory_format=torch.contiguous_format), \
        torch.empty_like(weight, memory_format=torch.contiguous_format), grad_bias
