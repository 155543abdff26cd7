"""Hugging Face transformers models: their own RMSNorm classes and the causal
LM's loss, swapped in place by :func:`fastreduce_torch.patch`.

transformers defines one RMSNorm class per architecture (and a few LayerNorm
ones), copies of a few forms, recognised here by their code (its syntax
tree, so comments and annotations do not count) rather than by name. Each
form is read from transformers' own classes at run time:

* cast, then the weight (Llama, Qwen2/3, Mistral, Mixtral, Phi-3, Llama 4,
  Mamba, ...): normalise in float32, cast to the input dtype, multiply by the
  weight;
* the weight in float32 (OLMo 2/3, GPT-OSS, DeepSeek-V4, Helium, Nemotron-H,
  Moshi, ...): multiply by the weight in float32, cast after;
* ``1 + weight`` (Gemma, Gemma 2/3): as the last, by ``1 + weight``;
* an optional weight (Gemma 3n, Gemma 4): the weight in float32 where the
  layer has one;
* no weight (nanochat, FalconMamba's weightless norm, ...);
* a half weight's dtype first (T5, mT5, UMT5, LongT5, Switch, ...): normalise
  in float32, cast to the weight's dtype where it is float16 / bfloat16,
  multiply;
* Cohere's LayerNorm: centred, no bias, the weight in float32, cast after.

A causal LM (``*ForCausalLM``, or a vision-language ``*ForConditionalGeneration``
whose loss is transformers' causal-LM loss) given ``labels`` computes its loss
with :func:`fused_linear_cross_entropy` from the last hidden states, so the
(tokens, vocab) logits are never made; without labels (inference,
``generate()``) it runs unchanged and returns its logits. Only where its code
hands that loss its output embeddings' logits as they are, multiplied or
divided by an attribute of the model (Cohere's logit_scale, Granite's
logits_scaling: the hidden states are scaled instead), then possibly
soft-capped, ``cap * tanh(logits / cap)`` with a cap the model, its config or
a module of its own holds (Gemma 2, RecurrentGemma, Mistral Large 4, Inkling
2); or a causal LM's inside it (Llama 4's, Blip-2's on a decoder-only
language model, the last positions of its logits), where the forward hands
them on. The others (otherwise sliced logits, caps of other forms, losses of
their own) keep their loss. The model's own forward runs, labels and all:
only its output embeddings and its loss_function are replaced while it does.

An encoder-decoder (T5, BART, Whisper, Marian, an EncoderDecoderModel, ...)
computes its cross-entropy in its own forward, on ``logits.view(-1, V)``:
given labels, its output embeddings return LazyLogits (lazy_logits.py), which
that cross-entropy fuses and anything else computes; so its loss is fused
where its code is the common one and its own wherever it is not.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import importlib
import inspect
import textwrap

import torch
import torch.nn.functional as F
from torch import Tensor

from .lazy_logits import LazyLogits
from .losses import fused_linear_cross_entropy
from .norms import layer_norm, rms_norm


def _eps(norm: torch.nn.Module) -> float:
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def _cast_then_weight(self, x: Tensor) -> Tensor:
    shape = x.shape[-1:]
    if self.weight.dtype == x.dtype:  # one rounding where the original has two (<= 1 ulp apart)
        return rms_norm(x, shape, self.weight, _eps(self))
    return self.weight * rms_norm(x, shape, None, _eps(self))


def _float32_weight(weight: Tensor, x: Tensor) -> Tensor:
    """The weight as fastreduce's rms_norm takes it beside x: its own dtype, or
    float32 (the same products, taken in float32 either way)."""
    return weight if weight.dtype in (x.dtype, torch.float32) else weight.float()


def _weight_in_float32(self, x: Tensor) -> Tensor:
    return rms_norm(x, x.shape[-1:], _float32_weight(self.weight, x), _eps(self))


def _one_plus_weight(self, x: Tensor) -> Tensor:
    return rms_norm(x, x.shape[-1:], 1.0 + self.weight.float(), _eps(self)).to(x.dtype)


def _optional_weight(self, x: Tensor) -> Tensor:
    weight = _float32_weight(self.weight, x) if self.with_scale else None
    return rms_norm(x, x.shape[-1:], weight, _eps(self))


def _unweighted(self, x: Tensor) -> Tensor:
    return rms_norm(x, x.shape[-1:], None, _eps(self))


def _half_weight_dtype_first(self, x: Tensor) -> Tensor:
    shape, weight, eps = x.shape[-1:], self.weight, _eps(self)
    if weight.dtype in (torch.float16, torch.bfloat16):
        if weight.dtype == x.dtype:  # one rounding where the original has two, as _cast_then_weight
            return rms_norm(x, shape, weight, eps)
        return weight * rms_norm(x, shape, None, eps).to(weight.dtype)
    return rms_norm(x.to(torch.promote_types(x.dtype, weight.dtype)), shape, weight, eps)


def _centred_weight_in_float32(self, x: Tensor) -> Tensor:
    if self.weight.dim() != 1:  # a weight a head (Cohere's q/k norms): the original
        return super(type(self), self).forward(x)
    return layer_norm(x, x.shape[-1:], _float32_weight(self.weight, x), None, _eps(self))


# transformers' classes that define each form: (model, class) -> fastreduce's forward.
_FORMS = {
    ("llama", "LlamaRMSNorm"): _cast_then_weight,
    ("llama4", "Llama4TextRMSNorm"): _cast_then_weight,
    ("olmo2", "Olmo2RMSNorm"): _weight_in_float32,
    ("helium", "HeliumRMSNorm"): _weight_in_float32,
    ("moshi", "MoshiRMSNorm"): _weight_in_float32,
    ("gemma", "GemmaRMSNorm"): _one_plus_weight,
    ("gemma3n", "Gemma3nRMSNorm"): _optional_weight,
    ("nanochat", "NanoChatRMSNorm"): _unweighted,
    ("inkling2", "Inkling2UnweightedRMSNorm"): _unweighted,
    ("t5", "T5LayerNorm"): _half_weight_dtype_first,
    ("cohere", "CohereLayerNorm"): _centred_weight_in_float32,
}


def _syntax(function) -> ast.Module | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None


def _tree(function) -> str | None:
    """A function's syntax tree without annotations or docstring (the copies of
    one form differ in those and in comments), as text."""
    tree = _syntax(function)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            if ast.get_docstring(node) is not None:
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _calls_norm(cls: type) -> bool:
    source = _tree(cls.forward)
    return source is not None and "attr='_norm'" in source


@functools.cache
def _norm_forms() -> tuple[dict[str, object], frozenset[str]]:
    """The forward tree of each known form -> fastreduce's forward, and the
    trees of the ``_norm`` helpers those forwards may call (x times the
    reciprocal root of its mean square plus eps)."""
    forwards, helpers = {}, set()
    for (model, name), forward in _FORMS.items():
        try:
            cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
        except (ImportError, AttributeError):  # an older transformers without that model
            continue
        forwards[_tree(cls.forward)] = forward
        if _calls_norm(cls):
            helpers.add(_tree(cls._norm))
    forwards.pop(None, None)
    helpers.discard(None)
    return forwards, frozenset(helpers)


@functools.cache
def _fused_norm_class(cls: type) -> type | None:
    """A subclass of a transformers RMSNorm class with fastreduce's forward, or
    None where its code is none of the known forms."""
    if not cls.__name__.endswith(("RMSNorm", "LayerNorm")) or not cls.__module__.startswith("transformers."):
        return None
    forwards, helpers = _norm_forms()
    forward = forwards.get(_tree(cls.forward))
    if forward is None or (_calls_norm(cls) and _tree(getattr(cls, "_norm", None)) not in helpers):
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
    """The output embeddings while a patched model computes its loss: it keeps
    its input (the last hidden states) and returns empty logits (last dim 0),
    which the model's own code scales or caps and hands to its loss_function,
    the fused loss on the kept hidden states."""

    caught: Tensor | None = None
    catching: bool = False

    def forward(self, input: Tensor) -> Tensor:
        if not self.catching:
            return F.linear(input, self.weight, self.bias)
        self.caught = input
        return input.new_empty(input.shape[:-1] + (0,))


def causal_lm_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                   softcap: float | None = None, num_items_in_batch: Tensor | int | None = None,
                   ignore_index: int = -100, shift_labels: Tensor | None = None) -> Tensor:
    """transformers' ForCausalLMLoss on ``F.linear(hidden, weight, bias)``, fused: labels shifted
    left by one (unless ``shift_labels`` are given), the mean over kept tokens,
    or the sum divided by ``num_items_in_batch`` (gradient accumulation)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, target, bias,
                                      ignore_index=ignore_index, reduction=reduction, softcap=softcap)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step of the way from a model to a value its forward reads:
    ``.name``, ``.name()`` (``call``), or ``getattr(_, "name", *default)``."""

    name: str
    call: bool = False
    default: tuple = ()

    def take(self, value):
        value = getattr(value, self.name, *self.default)
        return value() if self.call else value


def _follow(path: tuple[_Step, ...], model: torch.nn.Module):
    for step in path:
        model = step.take(model)
    return model


@dataclasses.dataclass(frozen=True)
class _Logits:
    """How a causal LM's forward makes the logits it hands its loss:
    ``self.<head>(hidden)``, then multiplied or divided by the value at
    ``scale`` (Cohere's ``self.logit_scale``, Granite's
    ``self.config.logits_scaling``, ...), then soft-capped, ``cap * tanh(logits
    / cap)``, by the cap at ``softcap`` (Gemma 2's
    ``self.config.final_logit_softcapping``; None: no cap). Both are paths
    from the model, read when the loss is computed. ``last_labels``: only the
    last ``labels.size(1)`` positions' logits (Blip-2, whose query tokens
    come first). ``when``: the values, at paths from the model, that put the
    loss where the forward computes it (Blip-2's
    ``config.use_decoder_only_language_model``), checked by patch()."""

    head: tuple[str, ...]
    scale: tuple[_Step, ...] = ()
    divide: bool = False
    softcap: tuple[_Step, ...] | None = None
    last_labels: bool = False
    when: tuple[tuple[tuple[_Step, ...], bool], ...] = ()
    child: str | None = None  # the causal LM inside whose output logits these are (_model_logits)

    def factor(self, model: torch.nn.Module):
        """The value the logits are scaled by."""
        return _follow(self.scale, model)

    def cap(self, model: torch.nn.Module) -> float | None:
        """The soft-cap as the model's forward reads it (None: no cap)."""
        return None if self.softcap is None else _follow(self.softcap, model)

    def within(self, child: str) -> "_Logits":
        """These logits, made by a model's ``self.<child>``, from the model."""
        return dataclasses.replace(self, head=(child, *self.head),
                                   scale=(_Step(child), *self.scale) if self.scale else (),
                                   when=tuple(((_Step(child), *path), value) for path, value in self.when))

    def holds(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` computes its loss where this reading found it."""
        return all(bool(_follow(path, model)) == value for path, value in self.when)

    def scaled(self, model: torch.nn.Module, hidden: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """hidden and bias scaled so that ``head(hidden)`` gives the scaled logits
        (``(s h) W^T + s b = s (h W^T + b)``)."""
        if not self.scale:
            return hidden, bias
        s = self.factor(model)
        if self.divide:
            return hidden / s, None if bias is None else bias / s
        return hidden * s, None if bias is None else bias * s


def _fused_loss(model: torch.nn.Module, logits: Tensor, labels: Tensor, vocab_size: int | None = None,
                num_items_in_batch: Tensor | int | None = None, ignore_index: int = -100,
                shift_labels: Tensor | None = None, **kwargs) -> Tensor:
    """transformers' ForCausalLMLoss as the patched model's forward calls it,
    with the empty logits: on the hidden states its output embeddings kept."""
    head, how = model.get_output_embeddings(), model._fastreduce_logits
    hidden, bias = how.scaled(model, head.caught, head.bias)
    if how.last_labels:
        hidden = hidden[:, -labels.size(1):, :]
    return causal_lm_loss(hidden, head.weight, bias, labels, how.cap(model), num_items_in_batch, ignore_index,
                          shift_labels)


def _is_causal_lm_loss(loss_function) -> bool:
    return getattr(loss_function, "__name__", "") == "ForCausalLMLoss"


def _causal_lm_forward(self, *args, labels: Tensor | None = None, **kwargs):
    original = self._fastreduce_original_forward
    head = self.get_output_embeddings()
    if labels is None or not isinstance(head, _HiddenCatcher) or not _is_causal_lm_loss(self.loss_function):
        return original(*args, labels=labels, **kwargs)
    return_dict = kwargs.pop("return_dict", None)
    head.catching = True
    try:
        out = original(*args, labels=labels, return_dict=True, **kwargs)
    finally:
        head.catching, head.caught = False, None
    out = type(out)(**{k: v for k, v in out.items() if k != "logits"})
    return out if return_dict is not False else out.to_tuple()


@functools.cache
def _fused_causal_lm_class(cls: type, logits: _Logits) -> type:
    """``cls`` whose forward, given labels, lets the output embeddings keep the
    hidden states and whose loss_function is then the fused loss on them."""
    transformers_loss = inspect.getattr_static(cls, "loss_function")

    def loss_function(self):
        if getattr(self.get_output_embeddings(), "catching", False):
            return functools.partial(_fused_loss, self)
        return transformers_loss.fget(self)

    return type(cls.__name__, (cls,), {
        "forward": _causal_lm_forward, "_fastreduce_original_forward": cls.forward, "_fastreduce_logits": logits,
        "loss_function": property(loss_function, transformers_loss.fset), "__module__": __name__})


def _head_call(node: ast.expr) -> str | None:
    """``X`` of ``self.X(...)``, as is or followed by ``.float()`` / ``.contiguous()``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
            and node.func.attr in ("float", "contiguous"):
        node = node.func.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
        return node.func.attr
    return None


def _output_logits(node: ast.expr, tree: ast.Module, skipped: set[int]) -> str | None:
    """``child`` where ``node`` is ``out[0]`` or ``out.logits`` and ``out`` is
    assigned once (outside the ``skipped`` nodes), from ``self.<child>(...)``
    without labels (Llama 4's and Blip-2's vision-language models on their
    inner causal LM)."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
        out = node.value
    elif isinstance(node, ast.Attribute) and node.attr == "logits":
        out = node.value
    else:
        return None
    if not isinstance(out, ast.Name):
        return None
    calls = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and id(n) not in skipped
             and any(isinstance(t, ast.Name) and t.id == out.id for t in n.targets)]
    if len(calls) != 1 or not isinstance(calls[0], ast.Call) or any(k.arg == "labels" for k in calls[0].keywords):
        return None
    return _head_call(calls[0])


def _path(node: ast.expr) -> tuple[_Step, ...] | None:
    """The steps from ``self`` to the value of ``node``: attributes, methods
    called without arguments, ``getattr(x, "name"[, constant])``; None for
    any other expression."""
    if isinstance(node, ast.Name):
        return () if node.id == "self" else None
    if isinstance(node, ast.Attribute):
        base, step = node.value, _Step(node.attr)
    elif isinstance(node, ast.Call) and not node.keywords and isinstance(node.func, ast.Attribute) and not node.args:
        base, step = node.func.value, _Step(node.func.attr, call=True)
    elif isinstance(node, ast.Call) and not node.keywords and ast.unparse(node.func) == "getattr" \
            and len(node.args) in (2, 3) and all(isinstance(a, ast.Constant) for a in node.args[1:]) \
            and isinstance(node.args[1].value, str):
        base, step = node.args[0], _Step(node.args[1].value, default=tuple(a.value for a in node.args[2:]))
    else:
        return None
    path = _path(base)
    return None if path is None else (*path, step)


def _scaling(node: ast.expr) -> tuple[ast.expr, tuple[_Step, ...], bool] | None:
    """``(a, path, divide)`` of ``a * <path>`` or ``a / <path>`` (a _path from self)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        path = _path(node.right)
        if path:
            return node.left, path, isinstance(node.op, ast.Div)
    return None


def _binds(node: ast.AST, name: str) -> bool:
    """Whether ``node`` assigns to ``name`` (or to a part of it)."""
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For)) else []
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def _inlined(node: ast.expr, tree: ast.Module) -> ast.expr:
    """``node`` with each name the function binds once, by an assignment or a
    walrus, replaced by the value bound (``cap = self.config.logits_soft_cap``)."""
    def value(name: str) -> ast.expr | None:
        stores = [n for n in ast.walk(tree)
                  if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)]
        if len(stores) != 1 or any(isinstance(a, ast.arg) and a.arg == name for a in ast.walk(tree)):
            return None  # bound twice, or an argument
        return next((n.value for n in ast.walk(tree)
                     if isinstance(n, ast.Assign) and len(n.targets) == 1 and n.targets[0] is stores[0]
                     or isinstance(n, ast.NamedExpr) and n.target is stores[0]), None)

    class Inline(ast.NodeTransformer):
        def __init__(self, seen: frozenset[str] = frozenset()):
            self.seen = seen

        def visit_NamedExpr(self, node: ast.NamedExpr) -> ast.expr:
            return self.visit(node.value)

        def visit_Name(self, node: ast.Name) -> ast.expr:
            bound = None if node.id in self.seen else value(node.id)
            return node if bound is None else Inline(self.seen | {node.id}).visit(copy.deepcopy(bound))

    return Inline().visit(copy.deepcopy(node))


def _tanh_of(node: ast.expr) -> ast.expr | None:
    """``x`` of ``torch.tanh(x)`` (``nn.functional.tanh(x)``, ...) or ``x.tanh()``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tanh" \
            and not node.keywords and len(node.args) <= 1:
        return node.args[0] if node.args else node.func.value
    return None


def _divided(node: ast.expr, logits: str) -> ast.expr | None:
    """``cap`` of ``logits / cap`` or ``logits.float() / cap``."""
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Div):
        return None
    left = node.left
    if isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute) and left.func.attr == "float" \
            and not left.args:
        left = left.func.value
    return node.right if isinstance(left, ast.Name) and left.id == logits else None


def _module_cap(cls: type, attribute: str) -> ast.expr | None:
    """``self.<attribute>.<cap>`` where ``cls.__init__`` sets ``self.<attribute>``
    once, to a module whose forward returns ``tanh(x / self.<cap>) * self.<cap>``
    of its input ``x`` (Inkling 2's ``logit_softcap``)."""
    init = _syntax(getattr(cls, "__init__", None))
    built = [node.value for node in ast.walk(init or ast.Module([], []))
             if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [f"self.{attribute}"]]
    if len(built) != 1 or not isinstance(built[0], ast.Call) or not isinstance(built[0].func, ast.Name):
        return None
    module = cls.__init__.__globals__.get(built[0].func.id)
    forward = _syntax(getattr(module, "forward", None)) if isinstance(module, type) else None
    if forward is None or len(forward.body) != 1 or not isinstance(forward.body[0], ast.FunctionDef):
        return None
    function = forward.body[0]
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    if len(function.args.args) != 2 or len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    x = function.args.args[1].arg
    capped = _softcap([ast.Assign(targets=[ast.Name(x, ast.Store())], value=body[0].value)], x, module)
    if capped is None or capped[1] != 1 or _path(capped[0]) is None:
        return None

    class Reroot(ast.NodeTransformer):  # the module's self: the model's self.<attribute>
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return ast.Attribute(ast.Name("self", ast.Load()), attribute, ast.Load()) if node.id == "self" else node

    return Reroot().visit(copy.deepcopy(capped[0]))


def _softcap(steps: list[ast.Assign], logits: str, cls: type) -> tuple[ast.expr, int] | None:
    """``(cap, n)`` where the first ``n`` assignments of ``steps`` (in
    ``cls.forward``) soft-cap ``logits``: ``logits = tanh(logits / cap) * cap``
    (either order); ``logits = logits / cap``, ``logits = tanh(logits)``,
    ``logits = logits * cap``; or ``logits = self.<m>(logits)``, ``m`` a module
    of the first form (_module_cap)."""
    first = steps[0].value
    if isinstance(first, ast.Call) and len(first.args) == 1 and not first.keywords \
            and isinstance(first.args[0], ast.Name) and first.args[0].id == logits:
        path = _path(first.func)
        cap = _module_cap(cls, path[0].name) if path is not None and len(path) == 1 and not path[0].call else None
        return None if cap is None else (cap, 1)
    if isinstance(first, ast.BinOp) and isinstance(first.op, ast.Mult):
        for capped, cap in ((first.left, first.right), (first.right, first.left)):
            inner = _tanh_of(capped)
            if inner is not None and (divisor := _divided(inner, logits)) is not None \
                    and ast.unparse(divisor) == ast.unparse(cap):
                return cap, 1
    cap = _divided(first, logits)
    if cap is None or len(steps) < 3:
        return None
    tanh, last = _tanh_of(steps[1].value), steps[2].value
    if not (isinstance(tanh, ast.Name) and tanh.id == logits and isinstance(last, ast.BinOp)
            and isinstance(last.op, ast.Mult)):
        return None
    if sorted((ast.unparse(last.left), ast.unparse(last.right))) != sorted((logits, ast.unparse(cap))):
        return None
    return cap, 3


def _guarded(step: ast.stmt, cap: ast.expr, tree: ast.Module, parents: dict[int, ast.AST]) -> bool:
    """Whether ``step`` is in the function's body, or in that of ``if <cap> is
    not None:`` (a cap of None then caps nothing, as in the forward); ``cap``
    with its names inlined (_inlined)."""
    child, node = step, parents[id(step)]
    while not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        test = node.test if isinstance(node, ast.If) else None
        if not (isinstance(test, ast.Compare) and any(child is n for n in node.body)
                and [type(op) for op in test.ops] == [ast.IsNot]
                and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
                and ast.unparse(_inlined(test.left, tree)) == ast.unparse(cap)):
            return False
        child, node = node, parents[id(node)]
    return True


def _branches(calls: list[ast.Call], parents: dict[int, ast.AST]) -> tuple[tuple, set[int]]:
    """``(when, skipped)``: for each ``if <path of self>:`` around the calls,
    the path and whether the calls are in its body (_Logits.when), and the ids
    of every node of the branch they are not in."""
    when, skipped = [], set()
    for call in calls:
        child, node = call, parents[id(call)]
        while not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(node, ast.If) and (path := _path(node.test)):
                inside = any(child is n for n in node.body)
                when.append((path, inside))
                skipped |= {id(n) for branch in (node.orelse if inside else node.body) for n in ast.walk(branch)}
            child, node = node, parents[id(node)]
    return tuple(dict.fromkeys(when)), skipped


@functools.cache
def _loss_logits(cls: type) -> _Logits | None:
    """How ``cls.forward`` makes the logits it hands ``self.loss_function``,
    where that is the output embeddings' logits, possibly scaled by an
    attribute of the model (Cohere, Granite, FalconH1), then possibly
    soft-capped (Gemma 2, RecurrentGemma, Inkling 2), or those of a causal LM
    inside (``child``, resolved by _model_logits), possibly cut to the
    labels' last positions (Blip-2); None for anything else (otherwise sliced
    logits, another loss)."""
    tree = _syntax(getattr(cls, "forward", None))
    if tree is None:
        return None
    losses = [node for node in ast.walk(tree)
              if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.loss_function"]
    given = {ast.unparse(next((k.value for k in call.keywords if k.arg == "logits"),
                              call.args[0] if call.args else ast.Constant(None))) for call in losses}
    if len(given) != 1 or not next(iter(given)).isidentifier():
        return None
    logits = given.pop()  # the variable every loss call is given: logits, lm_logits, ...
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    when, skipped = _branches(losses, parents)
    steps = sorted((node for node in ast.walk(tree) if id(node) not in skipped and _binds(node, logits)),
                   key=lambda n: (n.lineno, n.col_offset))
    if not all(isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
               for s in steps):
        return None
    last_labels = {f"{logits}[:, -labels.{size}:, :]" for size in ("size(1)", "shape[1]")}
    made = []  # (0, the head), (1, the last labels' rows), (2, a scale), (3, the cap), in the forward's order
    while steps:
        capped = _softcap(steps, logits, cls)
        if capped is not None:
            cap, n = _inlined(capped[0], tree), capped[1]
            if len({id(parents[id(s)]) for s in steps[:n]}) != 1 or not _guarded(steps[0], cap, tree, parents):
                return None
            made.append((3, _path(cap)))
            steps = steps[n:]
            continue
        value = steps.pop(0).value
        if ast.unparse(value) in last_labels:
            made.append((1, True))
            continue
        scaling = _scaling(value)
        if scaling is not None:
            value, path, divide = scaling
        if scaling is None or not (isinstance(value, ast.Name) and value.id == logits):
            head = _head_call(value)
            made.append((0, (head,) if head is not None else _output_logits(value, tree, skipped)))
        if scaling is not None:
            made.append((2, (path, divide)))
    ranks = [rank for rank, _ in made]
    parts = dict(made)
    if ranks != sorted(set(ranks)) or parts.get(0) is None or 3 in parts and parts[3] is None:
        return None
    if isinstance(parts[0], str):  # a child's logits, as they are or cut
        return _Logits((), last_labels=1 in parts, when=when, child=parts[0]) if set(parts) <= {0, 1} else None
    return _Logits(parts[0], *parts.get(2, ((), False)), softcap=parts.get(3), last_labels=1 in parts, when=when)


def _model_logits(model: torch.nn.Module) -> _Logits | None:
    """_loss_logits of the model's class; where its logits are a child causal
    LM's output, the child's, reached from the model."""
    how = _loss_logits(type(model))
    if how is None or how.child is None:
        return how
    child = getattr(model, how.child, None)
    inner = _model_logits(child) if isinstance(child, torch.nn.Module) else None
    if inner is None or inner.softcap is not None or inner.last_labels:
        return None
    inner = inner.within(how.child)
    return dataclasses.replace(inner, last_labels=how.last_labels, when=how.when + inner.when)


def patch_causal_lm(model: torch.nn.Module) -> bool:
    """Routes a transformers causal LM's training loss through
    fused_linear_cross_entropy; False if ``model`` is not one, or one whose
    loss is not cross-entropy on its output embeddings' (scaled) logits."""
    if not type(model).__name__.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) \
            or not isinstance(inspect.getattr_static(type(model), "loss_function", None), property):
        return False
    logits = _model_logits(model)
    if logits is None or not _is_causal_lm_loss(model.loss_function):
        return False
    head = model.get_output_embeddings()
    try:
        if type(head) is not torch.nn.Linear or functools.reduce(getattr, logits.head, model) is not head:
            return False
        logits.factor(model)
        cap = logits.cap(model)
        if not logits.holds(model):  # the forward computes its loss elsewhere (Blip-2 on T5)
            return False
    except AttributeError:
        return False
    if cap is not None and not isinstance(cap, (int, float)):
        return False
    head.__class__ = _HiddenCatcher
    model.__class__ = _fused_causal_lm_class(type(model), logits)
    return True


# ---- the encoder-decoder's loss


def _lm_head_dtype(input: Tensor) -> torch.dtype:
    """The dtype F.linear gives ``input``, autocast included."""
    device = input.device.type
    if torch.is_autocast_enabled(device) and input.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.get_autocast_dtype(device)
    return input.dtype


class _LazyHead(torch.nn.Linear):
    """The output embeddings of an encoder-decoder while it computes its loss:
    LazyLogits, which the model's own forward views, biases and hands to
    ``nn.CrossEntropyLoss``, fused there."""

    lazy: bool = False

    def forward(self, input: Tensor) -> Tensor:
        if not self.lazy:
            return F.linear(input, self.weight, self.bias)
        return LazyLogits(input, self.weight, self.bias, _lm_head_dtype(input))


def _encoder_decoder_forward(self, *args, labels: Tensor | None = None, **kwargs):
    original = self._fastreduce_original_forward
    head = self.get_output_embeddings()
    if labels is None or not isinstance(head, _LazyHead) or torch.compiler.is_compiling():
        return original(*args, labels=labels, **kwargs)
    head.lazy = True
    try:
        return original(*args, labels=labels, **kwargs)
    finally:
        head.lazy = False


@functools.cache
def _lazy_logits_class(cls: type) -> type:
    """``cls`` whose forward, given labels, has its output embeddings return LazyLogits."""
    return type(cls.__name__, (cls,), {"forward": _encoder_decoder_forward,
                                       "_fastreduce_original_forward": cls.forward, "__module__": __name__})


def _computes_cross_entropy(cls: type) -> bool:
    """Whether the class's forward builds ``CrossEntropyLoss`` or calls ``cross_entropy``."""
    tree = _syntax(getattr(cls, "forward", None))
    return tree is not None and any(
        isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
        in ("CrossEntropyLoss", "cross_entropy") for node in ast.walk(tree))


def patch_encoder_decoder(model: torch.nn.Module) -> bool:
    """Routes the cross-entropy a transformers encoder-decoder (T5, BART,
    Whisper, Marian, an EncoderDecoderModel, ...) computes on its logits when
    given labels through fused_linear_cross_entropy: its output embeddings
    return LazyLogits while it does. False if ``model`` is not one whose
    forward computes a cross-entropy on the logits of an nn.Linear."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False) \
            or not _computes_cross_entropy(type(model)):
        return False
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    if type(head) is not torch.nn.Linear:
        return False
    head.__class__ = _LazyHead
    model.__class__ = _lazy_logits_class(type(model))
    return True


def patch_losses(model: torch.nn.Module) -> None:
    """patch_causal_lm or patch_encoder_decoder on ``model``, or, where it is
    not a transformers model, on the outermost ones inside it (PEFT's
    wrappers, a user's own module). A model inside a transformers model is
    called as its parent decides."""
    if patch_causal_lm(model) or patch_encoder_decoder(model) \
            or any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):
        return
    for child in model.children():
        patch_losses(child)
