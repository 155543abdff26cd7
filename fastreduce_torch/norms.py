"""layer_norm, softmax and the GPT-2 causal softmax: typed wrappers, fake
kernels and autograd (each backward is a registered op, so it traces under
torch.compile and AOT autograd)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Layer normalisation over the trailing ``normalized_shape`` dims, like
    :func:`torch.nn.functional.layer_norm`."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    return torch.ops.fastreduce.layer_norm.default(input, shape, weight, bias, eps)[0]


def softmax(input: Tensor, dim: int = -1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Softmax over ``dim``, like :func:`torch.softmax` (with ``dtype`` the input is
    cast first). A dim other than the last costs one transposing copy each way."""
    return torch.ops.fastreduce.softmax.default(input, dim, dtype=dtype)


def causal_softmax(scores: Tensor, scale: float = 1.0) -> Tensor:
    """The GPT-2 attention softmax of ``scores`` shaped ``(..., T, T)``: row ``t`` is
    ``softmax(scale * scores[..., t, :t+1])`` and every entry above the diagonal is
    exactly 0. Reads only the lower triangle."""
    return torch.ops.fastreduce.causal_softmax.default(scores, scale)


# ---- fake kernels


def _check_floating(name: str, t: Tensor, argument: str) -> None:
    torch._check(t.dtype in FLOATING, lambda: f"{name}: unsupported dtype {t.dtype} for argument '{argument}'")


def _stats_dtype(input: Tensor) -> torch.dtype:
    widen = input.device.type == "cuda" and input.dtype != torch.float64
    return torch.float32 if widen else input.dtype


@torch.library.register_fake("fastreduce::layer_norm")
def _layer_norm_fake(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    _check_floating("layer_norm", input, "input")
    k = len(normalized_shape)
    torch._check(
        k >= 1 and input.dim() >= k and list(input.shape[input.dim() - k:]) == list(normalized_shape),
        lambda: f"layer_norm: argument 'normalized_shape' is {list(normalized_shape)}, expected input with "
        f"shape [*, {list(normalized_shape)}], but got input of size {list(input.shape)}",
    )
    stats_shape = list(input.shape[: input.dim() - k]) + [1] * k
    stats = input.new_empty(stats_shape, dtype=_stats_dtype(input))
    return input.new_empty(input.shape), stats, torch.empty_like(stats)


@torch.library.register_fake("fastreduce::layer_norm_backward")
def _layer_norm_backward_fake(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    grad_weight = weight.new_empty(weight.shape) if weight is not None else input.new_empty((0,))
    grad_bias = bias.new_empty(bias.shape) if bias is not None else input.new_empty((0,))
    return input.new_empty(input.shape), grad_weight, grad_bias


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


# ---- autograd


def _layer_norm_setup(ctx, inputs, output):
    input, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.normalized_shape = normalized_shape
    ctx.save_for_backward(input, mean, rstd, weight, bias)


def _layer_norm_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    input, mean, rstd, weight, bias = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = torch.ops.fastreduce.layer_norm_backward.default(
        grad_out.contiguous(), input, ctx.normalized_shape, mean, rstd, weight, bias
    )
    return (
        grad_input,
        None,
        grad_weight if weight is not None else None,
        grad_bias if bias is not None else None,
        None,
    )


def _softmax_setup(ctx, inputs, keyword_only_inputs, output):
    ctx.dim = inputs[1]
    ctx.input_dtype = inputs[0].dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (output,) = ctx.saved_tensors
    grad_input = torch.ops.fastreduce.softmax_backward.default(grad.contiguous(), output, ctx.dim)
    return grad_input.to(ctx.input_dtype), None


def _causal_setup(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _causal_backward(ctx, grad):
    (output,) = ctx.saved_tensors
    return torch.ops.fastreduce.causal_softmax_backward.default(grad.contiguous(), output, ctx.scale), None


torch.library.register_autograd("fastreduce::layer_norm", _layer_norm_backward, setup_context=_layer_norm_setup)
torch.library.register_autograd("fastreduce::softmax", _softmax_backward, setup_context=_softmax_setup)
torch.library.register_autograd("fastreduce::causal_softmax", _causal_backward, setup_context=_causal_setup)
