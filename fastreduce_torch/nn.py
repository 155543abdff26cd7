"""Drop-in modules: same constructors, parameters and state_dict as torch's."""

from __future__ import annotations

import torch
from torch import Tensor

from .norms import layer_norm, rms_norm, softmax


class LayerNorm(torch.nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` computed by fastreduce's kernels."""

    def forward(self, input: Tensor) -> Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """:class:`torch.nn.RMSNorm` computed by fastreduce's kernels."""

    def forward(self, input: Tensor) -> Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)


class Softmax(torch.nn.Softmax):
    """:class:`torch.nn.Softmax` computed by fastreduce's kernels."""

    def forward(self, input: Tensor) -> Tensor:
        # torch's legacy rule when dim is None (with its deprecation warning).
        dim = self.dim if self.dim is not None else torch.nn.functional._get_softmax_dim("softmax", input.dim(), 5)
        return softmax(input, dim)


def patch(model: torch.nn.Module) -> int:
    """Replaces, in place, every :class:`torch.nn.LayerNorm` and
    :class:`torch.nn.RMSNorm` in ``model`` with fastreduce's, and every RMSNorm
    of a Hugging Face transformers model with one computing the same thing on
    fastreduce's kernels; on a transformers causal LM (``model``, or one
    wrapped by modules of other libraries: PEFT's), the loss computed when
    ``labels`` are given becomes :func:`fastreduce_torch.fused_linear_cross_entropy`
    (no logits are made), and so does the cross-entropy an encoder-decoder's
    forward computes (T5, BART, Whisper: its logits come lazily). Parameters, buffers and the state_dict stay the same
    tensors. Returns how many normalisation layers were replaced."""
    from . import hf

    swaps = {torch.nn.LayerNorm: LayerNorm, torch.nn.RMSNorm: RMSNorm}
    replaced = 0
    for module in model.modules():
        if type(module) in swaps:
            module.__class__ = swaps[type(module)]
            replaced += 1
        elif hf.patch_norm(module):
            replaced += 1
    hf.patch_losses(model)
    return replaced
