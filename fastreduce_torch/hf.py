"""Hugging Face transformers models: their own RMSNorm classes and the causal
LM's loss, swapped in place by :func:`fastreduce_torch.patch`.

transformers defines one RMSNorm class per architecture, all copies of two
forms, recognised here by their code rather than by name:

* Llama's (Llama, Qwen2/3, Mistral, Mixtral, Phi-3, ...): normalise in
  float32, cast to the input dtype, multiply by the weight;
* Gemma's (Gemma, Gemma 2/3): multiply by ``1 + weight`` in float32, cast after.

A ``*ForCausalLM`` given ``labels`` computes its loss with
:func:`fused_linear_cross_entropy` from the last hidden states, so the
(tokens, vocab) logits are never made; without labels (inference,
``generate()``) it runs unchanged and returns its logits.
"""

from __future__ import annotations

import functools
import inspect
import textwrap

import torch
import torch.nn.functional as F
from torch import Tensor

from .losses import fused_linear_cross_entropy
from .norms import rms_norm


def _llama_rms_norm_forward(self, hidden_states: Tensor) -> Tensor:
    shape = hidden_states.shape[-1:]
    if self.weight.dtype == hidden_states.dtype:  # one rounding where Llama's code has two (<= 1 ulp apart)
        return rms_norm(hidden_states, shape, self.weight, self.variance_epsilon)
    return self.weight * rms_norm(hidden_states, shape, None, self.variance_epsilon)


def _gemma_rms_norm_forward(self, x: Tensor) -> Tensor:
    return rms_norm(x, x.shape[-1:], 1.0 + self.weight.float(), self.eps).to(x.dtype)


def _source(function) -> str | None:
    """A function's code without comments or blank lines (the copies of one
    form differ in their comments)."""
    try:
        lines = textwrap.dedent(inspect.getsource(function)).splitlines()
    except (OSError, TypeError):
        return None
    return "\n".join(line for line in lines if line.strip() and not line.strip().startswith("#"))


@functools.cache
def _norm_forms() -> dict[str, tuple]:
    """The forward source of each known form -> (fastreduce's forward, the
    source its ``_norm`` must have, or None)."""
    try:
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return {}
    return {_source(LlamaRMSNorm.forward): (_llama_rms_norm_forward, None),
            _source(GemmaRMSNorm.forward): (_gemma_rms_norm_forward, _source(GemmaRMSNorm._norm))}


@functools.cache
def _fused_norm_class(cls: type) -> type | None:
    """A subclass of a transformers RMSNorm class with fastreduce's forward, or
    None where its code is neither known form."""
    if not cls.__name__.endswith("RMSNorm") or not cls.__module__.startswith("transformers."):
        return None
    form = _norm_forms().get(_source(cls.forward))
    if form is None:
        return None
    forward, norm_source = form
    if norm_source is not None and _source(getattr(cls, "_norm", None)) != norm_source:
        return None
    return type(cls.__name__, (cls,), {"forward": forward, "__module__": __name__})


def patch_norm(module: torch.nn.Module) -> bool:
    """Swaps a transformers RMSNorm's class in place; False if not one."""
    fused = _fused_norm_class(type(module))
    if fused is None:
        return False
    module.__class__ = fused
    return True


# ---- the causal LM's loss


class _HiddenCatcher(torch.nn.Linear):
    """The lm_head while a patched model computes its loss: it keeps its input
    (the last hidden states) and returns no logits (an empty last dim)."""

    caught: Tensor | None = None
    catching: bool = False

    def forward(self, input: Tensor) -> Tensor:
        if not self.catching:
            return F.linear(input, self.weight, self.bias)
        self.caught = input
        return input.new_empty(input.shape[:-1] + (0,))


def causal_lm_loss(hidden: Tensor, head: torch.nn.Linear, labels: Tensor, softcap: float | None = None,
                   num_items_in_batch: Tensor | int | None = None, ignore_index: int = -100,
                   shift_labels: Tensor | None = None) -> Tensor:
    """transformers' ForCausalLMLoss on ``head(hidden)``, fused: labels shifted
    left by one (unless ``shift_labels`` are given), the mean over kept tokens,
    or the sum divided by ``num_items_in_batch`` (gradient accumulation)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, target, head.bias,
                                      ignore_index=ignore_index, reduction=reduction, softcap=softcap)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _causal_lm_forward(self, *args, labels: Tensor | None = None, **kwargs):
    original = self._fastreduce_original_forward
    head = self.get_output_embeddings()
    if labels is None or not isinstance(head, _HiddenCatcher):
        return original(*args, labels=labels, **kwargs)
    loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    return_dict = kwargs.pop("return_dict", None)
    head.catching = True
    try:
        out = original(*args, return_dict=True, **kwargs)
        hidden = head.caught
    finally:
        head.catching, head.caught = False, None
    softcap = getattr(self.config, "final_logit_softcapping", None)
    loss = causal_lm_loss(hidden, head, labels, softcap, **loss_kwargs)
    if getattr(out, "aux_loss", None) is not None:  # mixture-of-experts load balancing (Mixtral)
        loss = loss + self.router_aux_loss_coef * out.aux_loss.to(loss.device)
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    out = type(out)(loss=loss, **fields)
    return out if return_dict is not False else out.to_tuple()


@functools.cache
def _fused_causal_lm_class(cls: type) -> type:
    return type(cls.__name__, (cls,), {"forward": _causal_lm_forward, "_fastreduce_original_forward": cls.forward,
                                       "__module__": __name__})


def patch_causal_lm(model: torch.nn.Module) -> bool:
    """Routes a transformers causal LM's training loss through
    fused_linear_cross_entropy; False if ``model`` is not one."""
    name = type(model).__name__
    if not (name.endswith("ForCausalLM") or name.endswith("LMHeadModel")) or not hasattr(model, "loss_function"):
        return False
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return False
    head.__class__ = _HiddenCatcher
    model.__class__ = _fused_causal_lm_class(type(model))
    return True
