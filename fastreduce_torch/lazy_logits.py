"""Logits not yet computed: what a patched encoder-decoder's output embeddings
return while its forward computes the training loss.

A model such as T5, BART or Whisper makes its logits, may add a bias, and hands
``logits.view(-1, V)`` to ``nn.CrossEntropyLoss``: all in its own forward. The
output embeddings return a LazyLogits instead of the (tokens, vocab) logits; a
view that keeps the vocab last, a move to its own device and dtype, and the
addition of a bias over the vocab keep it lazy, and ``F.cross_entropy`` of it
is fused_linear_cross_entropy on the hidden states. Anything else computes the
logits first, so the forward's result is the same whatever its code does; only
the common path is spared the logits (``materializations`` counts the others).
"""
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_map

from .losses import fused_linear_cross_entropy

_METADATA = frozenset({
    Tensor.size, Tensor.dim, Tensor.numel, Tensor.stride, Tensor.is_contiguous,
    Tensor.shape.__get__, Tensor.dtype.__get__, Tensor.device.__get__, Tensor.ndim.__get__,
    Tensor.requires_grad.__get__, Tensor.is_cuda.__get__, Tensor.layout.__get__,
})
_VIEWS = frozenset({Tensor.view, Tensor.reshape})
_ADDS = frozenset({Tensor.add, Tensor.__add__, Tensor.__radd__, torch.add})


class LazyLogits(Tensor):
    """``F.linear(hidden, weight, bias)`` in ``dtype``, computed only when
    something other than a view, a bias or the cross-entropy reads it."""

    materializations = 0

    @staticmethod
    def __new__(cls, hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        shape = hidden.shape[:-1] + (weight.shape[0],)
        logits = Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=hidden.device)
        logits.hidden, logits.weight, logits.bias = hidden, weight, bias
        return logits

    def __repr__(self) -> str:
        return f"LazyLogits(shape={tuple(self.shape)}, dtype={self.dtype})"

    def _operands(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """hidden, weight and bias in the logits' dtype (F.linear's casts under autocast)."""
        dtype = self.dtype
        return self.hidden.to(dtype), self.weight.to(dtype), None if self.bias is None else self.bias.to(dtype)

    def materialize(self) -> Tensor:
        LazyLogits.materializations += 1
        return F.linear(*self._operands())

    def _viewed(self, shape) -> "LazyLogits | None":
        """The same logits in ``shape``, where its last dimension stays the vocab."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        try:
            shape = torch.empty(self.shape, device="meta").view(shape).shape
        except RuntimeError:
            return None
        if len(shape) == 0 or shape[-1] != self.shape[-1]:
            return None
        return LazyLogits(self.hidden.reshape(shape[:-1] + self.hidden.shape[-1:]), self.weight, self.bias,
                          self.dtype)

    def _moved(self, args, kwargs) -> "LazyLogits | None":
        """self, where ``.to(*args, **kwargs)`` leaves its device and dtype as they are."""
        kwargs = dict(kwargs)
        if kwargs.pop("copy", False):
            return None
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and not self._on(torch.device(device)) \
                or dtype is not None and dtype != self.dtype or memory_format is not None:
            return None
        return self

    def _on(self, device: torch.device) -> bool:
        """Whether ``device`` is this one (``"cuda"``: the current CUDA device)."""
        if device.type != self.device.type:
            return False
        if device.index == self.device.index:
            return True
        return device.index is None and device.type == "cuda" and torch.cuda.current_device() == self.device.index

    def _plus(self, other, kwargs) -> "LazyLogits | None":
        """self + other, where other is a bias over the vocab of this dtype."""
        if kwargs or not isinstance(other, Tensor) or isinstance(other, LazyLogits) or other.dtype != self.dtype \
                or other.device != self.device or other.dim() == 0 or other.shape[-1] != self.shape[-1] \
                or any(size != 1 for size in other.shape[:-1]) or other.dim() > self.dim():
            return None
        bias = other.reshape(-1)
        return LazyLogits(self.hidden, self.weight, bias if self.bias is None else self.bias + bias, self.dtype)

    def _cross_entropy(self, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                       reduction="mean", label_smoothing=0.0) -> Tensor | None:
        if self.dim() != 2 or not isinstance(target, Tensor) or target.dim() != 1 \
                or target.dtype != torch.int64 or target.shape[0] != self.shape[0] \
                or weight is not None or size_average is not None or reduce is not None:
            return None
        hidden, weight, bias = self._operands()
        loss = fused_linear_cross_entropy(hidden, weight, target, bias, ignore_index=ignore_index,
                                          reduction=reduction, label_smoothing=label_smoothing)
        # F.cross_entropy gives the input's dtype; under autocast, float32
        return loss if torch.is_autocast_enabled(self.device.type) else loss.to(self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        first = args[0] if args else None
        kept = None
        if isinstance(first, LazyLogits):
            if func in _VIEWS:
                kept = first._viewed(args[1:])
            elif func is Tensor.to:
                kept = first._moved(args[1:], kwargs)
            elif func is Tensor.contiguous and len(args) == 1 and not kwargs:
                kept = first
            elif func in _ADDS and len(args) == 2:
                kept = first._plus(args[1], kwargs)
            elif func is F.cross_entropy:
                kept = first._cross_entropy(*args[1:], **kwargs)
        elif func in _ADDS and len(args) == 2 and isinstance(args[1], LazyLogits):
            kept = args[1]._plus(first, kwargs)
        if kept is not None:  # still lazy, or the fused loss
            return kept
        args, kwargs = tree_map(lambda a: a.materialize() if isinstance(a, LazyLogits) else a, (args, kwargs))
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"LazyLogits reached {func} without __torch_function__")
