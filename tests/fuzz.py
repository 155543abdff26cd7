"""Differential fuzzing of every fastreduce operator against torch.

Each case is generated from (operator, index) alone: shapes (0-sized and 0-d
included), every dtype the operator takes, non-contiguous, offset and
broadcast layouts, special values (+-inf, NaN, huge and tiny finite values,
ties, zeros) and invalid arguments (dims, dtypes, shapes, targets, devices).
The rule: where torch raises, fastreduce raises a clear error; where torch
returns, fastreduce returns the same dtype, shape and device, the same values
within the dtype's tolerance and NaN/inf in the same places (and its fake
kernel the same metadata); where torch warns, fastreduce warns.

Where fastreduce's contract (SPEC.md) differs on purpose, the reference
says so where it is built: losses in float32 for half inputs (as transformers
upcasts the logits), exact zeros above causal_softmax's diagonal, norm
parameters in the input's dtype or float32 beside half inputs (torch falls
back to an unfused path there, with a warning), one residual shape for the
fused add (no broadcasting). A row's saved statistics where the row holds inf
(torch's Welford gives NaN or inf by the inf's place) and gradients through
non-finite values (NaN or inf by the order of the formula's terms, or of
the matmul's) must be
non-finite where torch's are, either kind. Values may also match torch's
float64 answer instead (where torch underflows, say), or, for a CUDA case,
torch's CPU answer (where torch's two backends differ).

tests/fuzz_runner.py runs cases in child processes, so a crash fails the
case it happened in (tests/test_fuzz.py through it; a range of indices from
the command line). One case, in this process, printing what it compared:

    python tests/fuzz.py --device cpu --op sum --case 17

A CUDA case's inputs replayed on the CPU (torch's and our CPU answers to
them, where no GPU is at hand): `--device cpu --drawn-as cuda`.
"""

import argparse
import math
import os
import random
import sys
import warnings
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

import fastreduce_torch  # noqa: F401  (registers the operators)

ops = torch.ops.fastreduce

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
EVERY_DTYPE = FLOATS + INTEGERS + [torch.bool]
SPECIALS = ["inf", "-inf", "nan", "huge", "tiny", "ties", "zeros"]
HUGE = {torch.float64: 1e150, torch.float32: 1e30, torch.bfloat16: 1e30, torch.float16: 1e3}
TINY = {torch.float64: 1e-300, torch.float32: 1e-30, torch.bfloat16: 1e-30, torch.float16: 1e-6}
# Relative tolerance by the dtype the values are computed in; absolute
# tolerance is this times the larger of the expected output's and the
# inputs' largest finite magnitude (sums of huge values cancel).
RTOL = {torch.float64: 1e-7, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SIZES = [0, 1, 2, 3, 5, 8, 17, 64, 130]


def _acc(x):
    """The dtype fastreduce (and torch's kernels) compute in for x."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _show(value):
    return str(value).replace("torch.", "").replace(" ", "")


class Case:
    """The random choices of one case, seeded by its name and recorded."""

    def __init__(self, op: str, index: int, device: str, drawn_as: str | None = None):
        self.op, self.index, self.device = op, index, device
        # The device whose case the choices draw: a CUDA case's inputs can
        # be replayed on the CPU (the choices differ only where devices mix).
        self.drawn_as = drawn_as or device
        self.rng = random.Random(f"{op}:{index}")
        # Rows split over a thread-block cluster, drawn from a stream of their
        # own so that every other case keeps its inputs.
        self.cluster_rng = random.Random(f"{op}:{index}:cluster_row")
        self.generator = torch.Generator().manual_seed(zlib.crc32(f"{op}:{index}".encode()))
        self.labels: list[str] = []
        self.scale = 0.0  # largest finite input magnitude (for the absolute tolerance)
        self.bad_targets = False  # a class index outside [0, classes) that is not ignored

    def pick(self, label, options, weights=None):
        value = self.rng.choices(options, weights)[0]
        self.labels.append(f"{label}={_show(value)}")
        return value

    def chance(self, label, p):
        hit = self.rng.random() < p
        if hit:
            self.labels.append(label)
        return hit

    def shape(self, min_dim=0, max_dim=4, max_numel=6000, sizes=SIZES):
        ndim = self.rng.randint(min_dim, max_dim)
        shape = [self.rng.choice(sizes if self.rng.random() < 0.9 else [1, 2]) for _ in range(ndim)]
        while math.prod(shape) > max_numel:
            shape[self.rng.randrange(ndim)] //= 2
        if ndim and self.chance("wide_row", 0.08):  # the block and register-row kernels
            shape = [max(1, s // 64) for s in shape[:-1]] + [self.rng.choice([1000, 2049, 4100, 12289])]
        if ndim and self.cluster_rng.random() < 0.03:  # past 8192 floats or 16384 halves, in 16-byte packs
            shape = [min(s, 3) for s in shape[:-1]] + [self.cluster_rng.choice([20000, 40000])]
            self.labels.append("cluster_row")
        self.labels.append(f"shape={tuple(shape)}")
        return tuple(shape)

    def values(self, shape, dtype, special=None, positive=False):
        g = self.generator
        if special in ("no_zeros", "sparse"):
            return self.logical_values(shape, dtype, special)
        if dtype == torch.bool:
            return torch.rand(shape, generator=g) < 0.5
        if not dtype.is_floating_point:
            low = 0 if dtype == torch.uint8 or positive else -4
            return torch.randint(low, 5, shape, generator=g).to(dtype)
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if positive:
            x = x.abs() + 0.5
        if special == "ties":
            x = x.round()
        elif special == "zeros":
            x.zero_()
        elif special == "huge":
            x *= HUGE[dtype]
        elif special == "tiny":
            x *= TINY[dtype]
        elif special in ("inf", "-inf", "nan"):
            x[torch.rand(shape, generator=g) < 0.2] = float(special)
        x = x.to(dtype)
        finite = x[x.isfinite()]
        if finite.numel():
            self.scale = max(self.scale, finite.abs().max().item())
        return x

    def logical_values(self, shape, dtype, fill):
        """Non-zeros everywhere ("no_zeros") or at 1% of the places ("sparse"); integers of
        every byte value (0x80 and 0xff among them)."""
        g = self.generator
        raw = torch.randint(1, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)
        if dtype.is_floating_point:
            x = (raw.to(torch.float64) - 128.5).to(dtype)
        else:
            x = raw.view(torch.int8) if dtype == torch.int8 else raw.to(dtype)
        if fill == "sparse":
            x[torch.rand(shape, generator=g) >= 0.01] = 0
        return x

    def tensor(self, shape, dtype, name="x", device=None, special="random", layout="random", positive=False):
        """A tensor of `shape` on the case's device (or `device`), in a random layout."""
        device = device or self.device
        if special == "random":
            special = None
            if dtype.is_floating_point and not positive:
                special = self.pick(f"{name}.values", [None] + SPECIALS, [12] + [1] * len(SPECIALS))
        if layout == "random":
            layout = self.pick(f"{name}.layout", ["contiguous", "transposed", "sliced", "offset", "broadcast"],
                               [8, 1, 1, 1, 1])
        shape = list(shape)
        base = list(shape)
        if layout == "transposed" and len(shape) >= 2:
            base[-1], base[-2] = base[-2], base[-1]
        elif layout == "sliced" and shape:
            base[-1] *= 2
        elif layout == "broadcast" and shape:
            broadcast_dim = self.rng.randrange(len(shape))
            base[broadcast_dim] = 1
        flat = self.values([math.prod(base) + 1], dtype, special, positive).to(device)
        x = (flat[1:] if layout == "offset" else flat[:-1]).view(base)
        if layout == "transposed" and len(shape) >= 2:
            x = x.transpose(-1, -2)
        elif layout == "sliced" and shape:
            x = x[..., ::2]
        elif layout == "broadcast" and shape:
            x = x.expand(shape)
        return x

    def other_device(self):
        """Where a tensor goes to mix devices: the CPU on CUDA cases, else nothing to mix."""
        return "cpu" if self.drawn_as != "cpu" else None

    def dims(self, ndim, *, optional=True, allow_empty=True, single=False):
        """A dim argument: valid ones, and out of range or repeated ones."""
        rank = max(ndim, 1)
        kinds = ["one", "negative", "out_of_range"]
        if optional:
            kinds.append("none")
        if not single:
            kinds += ["two", "repeated"] + (["empty"] if allow_empty else [])
        kind = self.pick("dim", kinds, [4, 2, 1] + ([3] if optional else []) + ([2, 1] + ([1] if allow_empty else [])
                                                                              if not single else []))
        if kind == "none":
            return None
        if kind == "out_of_range":
            d = rank if self.rng.random() < 0.5 else -rank - 1
            return d if single else [d]
        if kind == "empty":
            return []
        d = self.rng.randrange(rank)
        if kind == "negative":
            d -= rank
        if single:
            return d
        if kind == "two" and ndim >= 2:
            return sorted(self.rng.sample(range(ndim), 2))
        if kind == "repeated":
            return [d, d]
        return [d]


@dataclass
class Trial:
    """One call of ours against torch's counterpart (None: torch's contract raises there)."""

    ours: Callable
    args: tuple
    kwargs: dict = field(default_factory=dict)
    theirs: Callable | None = None
    their_args: tuple | None = None
    their_kwargs: dict | None = None
    rtol_dtype: torch.dtype | None = None  # the dtype the values are computed in
    fake: bool = True
    # Outputs where NaN and +-inf count alike (non-finite where torch's are):
    # a row's statistics, and gradients through non-finite values, whose
    # NaN-or-inf depends on the order of the formula's terms.
    loose_nonfinite: tuple = ()
    scale_power: int = 1  # outputs scale as the inputs to this power (var: 2)
    # Outputs whose terms keep at least this size whatever the inputs' scale
    # (a loss's gradient: probabilities of at least 1 / classes each).
    least_scale: float = 0.0
    # Outputs whose finite values rounding decides on this case (an
    # ill-conditioned softmax): only their non-finite places are compared.
    rounding_decides: tuple = ()

    def run_theirs(self):
        if self.theirs is None:
            raise RuntimeError("outside fastreduce's contract (the case expects an error)")
        return self.theirs(*(self.args if self.their_args is None else self.their_args),
                           **(self.kwargs if self.their_kwargs is None else self.their_kwargs))


OPS: dict[str, Callable[[Case], Trial]] = {}


def op(name):
    def register(fn):
        OPS[name] = fn
        return fn

    return register


# ---- reductions ---------------------------------------------------------


def _reduced(case, dtypes, special="random", **dim_options):
    """An input of one of `dtypes` (values as `special` says), a dim argument for it and keepdim."""
    x = case.tensor(case.shape(), case.pick("dtype", dtypes), special=special)
    return x, case.dims(x.dim(), **dim_options), case.pick("keepdim", [False, True])


def _reduction(case, dtypes, out_dtypes=(None,)):
    return (*_reduced(case, dtypes), case.pick("out_dtype", list(out_dtypes)))


@op("sum")
def _sum(case):
    x, dim, keepdim, dtype = _reduction(case, EVERY_DTYPE, [None, None, torch.float64, torch.float32, torch.int64])
    return Trial(ops.sum, (x, dim, keepdim), {"dtype": dtype}, torch.sum)


@op("mean")
def _mean(case):
    x, dim, keepdim, dtype = _reduction(case, EVERY_DTYPE, [None, None, torch.float64, torch.float32])
    return Trial(ops.mean, (x, dim, keepdim), {"dtype": dtype}, torch.mean)


def _prod_args(case):
    x = case.tensor(case.shape(max_numel=300), case.pick("dtype", EVERY_DTYPE))
    dim = case.dims(x.dim(), single=True)
    keepdim = case.pick("keepdim", [False, True])
    dtype = case.pick("out_dtype", [None, None, torch.float64, torch.int64])
    return x, dim, keepdim, dtype


def _torch_prod(x, dim, keepdim, dtype=None):
    if dim is None:  # torch.prod has no keepdim over every dim; sum's shape rule
        result = torch.prod(x, dtype=dtype)
        return result.reshape([1] * x.dim()) if keepdim else result
    return torch.prod(x, dim, keepdim, dtype=dtype)


def _product_of_others(rows):
    """The product of the other elements of each row (its last dim), from both ends."""
    one = torch.ones_like(rows[..., :1])
    before = torch.cat([one, rows[..., :-1]], -1).cumprod(-1)
    after = torch.cat([rows[..., 1:], one], -1).flip(-1).cumprod(-1).flip(-1)
    return before * after


@op("prod")
def _prod(case):
    x, dim, keepdim, dtype = _prod_args(case)
    return Trial(ops.prod, (x, None if dim is None else [dim], keepdim), {"dtype": dtype},
                 _torch_prod, (x, dim, keepdim), {"dtype": dtype})


@op("prod_backward")
def _prod_backward(case):
    x = case.tensor(case.shape(max_numel=300), case.pick("dtype", FLOATS))
    dim = case.dims(x.dim(), single=True)
    keepdim = case.pick("keepdim", [False, True])
    try:
        result = _torch_prod(x, dim, keepdim)
    except (RuntimeError, IndexError):
        result = torch.ones((), dtype=x.dtype, device=x.device)
    grad = case.tensor(result.shape, x.dtype, "grad")
    if case.other_device() and case.chance("result_on_cpu", 0.2):
        result = result.cpu()

    def theirs(grad, x, result, dim, keepdim):
        if result.device != x.device:
            raise RuntimeError("devices differ")
        leaf = x.detach().requires_grad_()
        gradient = torch.autograd.grad(_torch_prod(leaf, None if dim is None else dim[0], keepdim), leaf, grad)[0]
        if x.dim() == 0 or x.numel() == 0 or (x == 0).any():
            return gradient
        # Without a zero anywhere torch takes result / x, 0 where the product
        # underflowed; the product of the others there is torch's own formula
        # for tensors with a zero.
        rows = x.reshape(-1) if dim is None else x.movedim(dim[0], -1)
        others = _product_of_others(rows)
        others = others.reshape(x.shape) if dim is None else others.movedim(-1, dim[0])
        underflowed = _torch_prod(x, None if dim is None else dim[0], True) == 0
        incoming = grad.reshape(underflowed.shape)
        return torch.where(underflowed, incoming * others, gradient)

    return Trial(ops.prod_backward, (grad, x, result, None if dim is None else [dim], keepdim), {}, theirs)


op("amax")(lambda case: Trial(ops.amax, _reduced(case, EVERY_DTYPE, optional=False), {}, torch.amax))
op("amin")(lambda case: Trial(ops.amin, _reduced(case, EVERY_DTYPE, optional=False), {}, torch.amin))


def _moments(case, ours, theirs):
    x, dim, keepdim = _reduced(case, FLOATS + [torch.int64])
    correction = case.pick("correction", [None, 0, 1, 2, 0.5])
    # The mean of a slice holding inf: torch's CPU two-pass sum gives inf, its Welford (and ours) NaN.
    return Trial(ours, (x, dim), {"correction": correction, "keepdim": keepdim}, theirs, scale_power=2,
                 loose_nonfinite=(1,))


# The Python functions: their bindings turn the degrees-of-freedom warning into
# a Python warning, as torch's do (torch.ops calls leave it to the C++ log).
op("var")(lambda case: _moments(case, fastreduce_torch.var, torch.var))
op("std")(lambda case: _moments(case, fastreduce_torch.std, torch.std))
op("var_mean")(lambda case: _moments(case, fastreduce_torch.var_mean, torch.var_mean))
op("std_mean")(lambda case: _moments(case, fastreduce_torch.std_mean, torch.std_mean))


@op("logsumexp")
def _logsumexp(case):
    x, dim, keepdim = _reduced(case, FLOATS + [torch.int64], optional=False)
    def theirs(x, dim, keepdim):
        if dim == []:  # every dim, as amax's; torch's own fails to shape its result for dim=[]
            dim = list(range(x.dim())) or [0]
        return torch.logsumexp(x, dim, keepdim)

    return Trial(ops.logsumexp, (x, dim, keepdim), {}, theirs)


@op("norm")
def _norm(case):
    x = case.tensor(case.shape(), case.pick("dtype", FLOATS + [torch.int64]))
    ord = case.pick("ord", [2, 1, float("inf"), float("-inf"), 0, 3, 0.5, -1])
    dim = case.dims(x.dim())
    keepdim = case.pick("keepdim", [False, True])
    dtype = case.pick("out_dtype", [None, None, torch.float64, torch.float32, torch.int64])
    return Trial(ops.norm, (x, ord, dim, keepdim), {"dtype": dtype}, torch.linalg.vector_norm)


op("argmax")(lambda case: Trial(ops.argmax, _reduced(case, EVERY_DTYPE, single=True), {}, torch.argmax))
op("argmin")(lambda case: Trial(ops.argmin, _reduced(case, EVERY_DTYPE, single=True), {}, torch.argmin))


@op("aminmax")
def _aminmax(case):
    x, dim, keepdim = _reduced(case, EVERY_DTYPE, single=True)

    def theirs(x, dim, keepdim):  # torch's CPU shapes: its CUDA kernel drops keepdim when dim is None
        return tuple(r.to(x.device) for r in torch.aminmax(x.cpu(), dim=dim, keepdim=keepdim))

    return Trial(ops.aminmax, (x,), {"dim": dim, "keepdim": keepdim}, theirs)


def _logical(case):
    """any/all's input, a dim argument and keepdim: as _reduced's, or non-zero
    everywhere or almost nowhere, so that rows of every outcome reach the folds."""
    return _reduced(case, EVERY_DTYPE, special=case.pick("fill", ["random", "no_zeros", "sparse"], [2, 1, 1]))


op("any")(lambda case: Trial(ops.any, _logical(case), {}, torch.any))
op("all")(lambda case: Trial(ops.all, _logical(case), {}, torch.all))


@op("foreach_norm")
def _foreach_norm(case):
    dtype = case.pick("dtype", FLOATS)
    tensors = [case.tensor(case.shape(max_numel=2000), dtype, f"t{i}") for i in range(case.rng.randint(0, 4))]
    if tensors and case.chance("mixed_dtypes", 0.15):
        tensors[-1] = tensors[-1].to(torch.float64)
    if tensors and case.other_device() and case.chance("one_on_cpu", 0.15):
        tensors[0] = tensors[0].cpu()
    ord = case.pick("ord", [2, 1, float("inf"), 0, 3])
    if tensors and case.chance("one_element", 0.1):  # |x| at any order: no power to over- or underflow
        tensors[-1] = case.tensor(case.pick("one_element.shape", [(), (1,), (1, 1)]), tensors[-1].dtype, "t_one",
                                  device=tensors[-1].device, special=case.pick("one_element.values", ["huge", "tiny"]))
    return Trial(ops.foreach_norm, (tensors, ord), {}, torch._foreach_norm)


# ---- norms --------------------------------------------------------------


def _norm_input(case, max_numel=6000):
    dtype = case.pick("dtype", FLOATS + ([torch.int64] if case.chance("integer_input", 0.05) else []))
    x = case.tensor(case.shape(max_numel=max_numel), dtype)
    k = case.rng.randint(0, min(x.dim(), 2))
    normalized = list(x.shape[x.dim() - k:])
    if case.chance("normalized_shape_mismatch", 0.08):
        normalized = [s + 1 for s in normalized] or [3]
    case.labels.append(f"normalized_shape={normalized}")
    return x, normalized


def _param(case, name, normalized, x, optional=True):
    if optional and case.chance(f"no_{name}", 0.3):
        return None
    shape = list(normalized)
    if case.chance(f"{name}_wrong_shape", 0.06):
        shape = shape[:-1] + [shape[-1] + 1] if shape else [2]
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    dtype = case.pick(f"{name}.dtype", [dtype, torch.float32], [4, 1])
    device = case.other_device() if case.other_device() and case.chance(f"{name}_on_cpu", 0.08) else None
    return case.tensor(shape, dtype, name, device=device, special=None, layout="contiguous")


def _eps(case):
    return case.pick("eps", [1e-5, 1e-6, 0.0, 1.0])


def _contract_params(x, *params):
    """Norm parameters in x's dtype, or float32 beside half x (SPEC); one dtype."""
    for p in params:
        if p is not None and p.dtype != x.dtype and not (p.dtype == torch.float32 and x.dtype in FLOATS[2:]):
            raise RuntimeError(f"parameter dtype {p.dtype} beside {x.dtype} input (outside the contract)")
    if len({p.dtype for p in params if p is not None}) > 1:
        raise RuntimeError("weight and bias of different dtypes")


def _on_cpu(fn):
    """torch's CPU answer, on the inputs' device. The norms' references run on
    the CPU: torch's CUDA layer_norm refuses float32 parameters beside half
    input (its CPU one and fastreduce take them), and its CUDA rms_norm makes a
    row holding inf NaN where its CPU one (and fastreduce) give 0 for the
    finite entries."""
    def run(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        _same_device(*tensors)
        device = tensors[0].device if tensors else "cpu"
        result = fn(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
        return tuple(r.to(device) if isinstance(r, torch.Tensor) else r for r in result)

    return run


def _layer_norm_ref(x, normalized, weight, bias, eps):
    _contract_params(x, weight, bias)
    if x.is_cuda and any(p is not None and p.dtype != x.dtype for p in (weight, bias)):
        return _on_cpu(torch.native_layer_norm)(x, normalized, weight, bias, eps)  # statistics float32 as on CUDA
    return torch.native_layer_norm(x, normalized, weight, bias, eps)


@op("layer_norm")
def _layer_norm(case):
    x, normalized = _norm_input(case)
    weight, bias = _param(case, "weight", normalized, x), _param(case, "bias", normalized, x)
    eps = _eps(case)
    # eps 0 over a constant row: 0 * inf, NaN or inf by the order of the terms.
    return Trial(ops.layer_norm, (x, normalized, weight, bias, eps), {}, _layer_norm_ref,
                 loose_nonfinite=(0, 1, 2) if eps == 0 else (1, 2))


def _rms_norm_ref(x, normalized, weight=None, eps=None):
    """torch.rms_norm's output (it checks the shapes) and rstd, float32 for half input."""
    _contract_params(x, weight)
    out = torch.rms_norm(x, normalized, weight, eps)
    dims = list(range(x.dim() - len(normalized), x.dim()))
    eps = torch.finfo(_acc(x)).eps if eps is None else eps  # torch: the opmath type's
    return out, torch.rsqrt(x.to(_acc(x)).pow(2).mean(dims, keepdim=True) + eps)


@op("rms_norm")
def _rms_norm(case):
    x, normalized = _norm_input(case)
    weight = _param(case, "weight", normalized, x)
    eps = case.pick("eps", [None, 1e-6, 0.0, 1.0])
    return Trial(ops.rms_norm, (x, normalized, weight, eps), {}, _on_cpu(_rms_norm_ref), loose_nonfinite=(1,))


def _residual(case, x):
    dtype = case.pick("residual.dtype", [x.dtype, torch.float32, torch.float64], [4, 1, 1])
    shape = x.shape if not case.chance("residual_wrong_shape", 0.06) else (*x.shape[:-1], x.shape[-1] + 1) \
        if x.dim() else (2,)
    device = case.other_device() if case.other_device() and case.chance("residual_on_cpu", 0.08) else None
    return case.tensor(shape, dtype, "residual", device=device)


@op("add_layer_norm")
def _add_layer_norm(case):
    x, normalized = _norm_input(case)
    residual = _residual(case, x)
    weight, bias = _param(case, "weight", normalized, x), _param(case, "bias", normalized, x)

    def theirs(x, residual, normalized, weight, bias, eps):
        if residual.shape != x.shape or not x.dtype.is_floating_point:
            raise RuntimeError("the fused add takes floating input and a residual of its shape (no broadcasting)")
        h = x + residual
        out, mean, rstd = _layer_norm_ref(h, normalized, weight, bias, eps)
        return out, h, mean, rstd

    eps = _eps(case)
    return Trial(ops.add_layer_norm, (x, residual, normalized, weight, bias, eps), {}, theirs,
                 loose_nonfinite=(0, 2, 3) if eps == 0 else (2, 3))


@op("add_rms_norm")
def _add_rms_norm(case):
    x, normalized = _norm_input(case)
    residual = _residual(case, x)
    weight = _param(case, "weight", normalized, x)
    eps = case.pick("eps", [None, 1e-6, 0.0])

    def theirs(x, residual, normalized, weight, eps):
        if residual.shape != x.shape or not x.dtype.is_floating_point:
            raise RuntimeError("the fused add takes floating input and a residual of its shape (no broadcasting)")
        h = x + residual
        out, rstd = _rms_norm_ref(h, normalized, weight, eps)
        return out, h, rstd

    return Trial(ops.add_rms_norm, (x, residual, normalized, weight, eps), {}, _on_cpu(theirs), loose_nonfinite=(2,))


def _saved_on_cpu(case, name, tensor):
    if case.other_device() and case.chance(f"{name}_on_cpu", 0.1):
        return tensor.cpu()
    return tensor


def _grads(fn, inputs, grad):
    """torch's gradients of fn(*inputs) for the inputs that are tensors (None elsewhere)."""
    leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t for t in inputs]
    wanted = [t for t in leaves if isinstance(t, torch.Tensor)]
    got = iter(torch.autograd.grad(fn(*leaves), wanted, grad, allow_unused=True))
    return [next(got) if isinstance(t, torch.Tensor) else None for t in leaves]


def _same_device(*tensors):
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise RuntimeError(f"tensors on {devices}")


@op("layer_norm_backward")
def _layer_norm_backward(case):
    x, normalized = _norm_input(case, max_numel=3000)
    x = x if x.dtype.is_floating_point else x.float()
    weight, bias = _param(case, "weight", normalized, x), _param(case, "bias", normalized, x)
    mean = rstd = torch.zeros(x.shape[:1], device=x.device)  # when neither forward runs
    for params in ((weight, bias), (None, None)):  # the statistics of the forward with these parameters
        try:
            _, mean, rstd = torch.native_layer_norm(x, normalized, *params, 1e-5)
            break
        except RuntimeError:
            pass
    grad = case.tensor(x.shape, x.dtype, "grad")
    grad_residual = case.tensor(x.shape, x.dtype, "grad_residual") if case.chance("grad_residual", 0.3) else None
    mean, rstd = _saved_on_cpu(case, "mean", mean), _saved_on_cpu(case, "rstd", rstd)

    grad_out_dtype = x.dtype

    def theirs(grad, x, normalized, mean, rstd, weight, bias, grad_residual):
        _same_device(grad, x, mean, rstd, weight, bias, grad_residual)
        _contract_params(x, weight, bias)
        mixed = any(p is not None and p.dtype != x.dtype for p in (weight, bias))
        if mixed:  # half activations, float32 parameters: torch's CPU backward lacks them, its CUDA one computes so
            grad, x = grad.float(), x.float()
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(grad, x, normalized, mean, rstd, weight, bias,
                                                               [True, weight is not None, bias is not None])
        dx = dx.to(grad_out_dtype)
        return (dx if grad_residual is None else dx + grad_residual), dw, db

    return Trial(ops.layer_norm_backward, (grad, x, normalized, mean, rstd, weight, bias, grad_residual), {}, theirs,
                 loose_nonfinite=(0, 1, 2))


@op("rms_norm_backward")
def _rms_norm_backward(case):
    x, normalized = _norm_input(case, max_numel=3000)
    x = x if x.dtype.is_floating_point else x.float()
    weight = _param(case, "weight", normalized, x)
    eps = case.pick("eps", [None, 1e-6])
    try:
        _, rstd = _rms_norm_ref(x, normalized, None, eps)
    except (RuntimeError, ValueError):
        rstd = torch.ones(x.shape[:1], device=x.device)
    grad = case.tensor(x.shape, x.dtype, "grad")
    grad_residual = case.tensor(x.shape, x.dtype, "grad_residual") if case.chance("grad_residual", 0.3) else None
    rstd = _saved_on_cpu(case, "rstd", rstd)

    def theirs(grad, x, normalized, rstd, weight, grad_residual):
        _same_device(grad, x, rstd, weight, grad_residual)
        _contract_params(x, weight)
        dx, dw = _grads(lambda x, w: torch.rms_norm(x, normalized, w, eps), (x, weight), grad)
        return (dx if grad_residual is None else dx + grad_residual), dw

    # Values in the dtype torch's autograd computes them in (rstd recomputed there).
    return Trial(ops.rms_norm_backward, (grad, x, normalized, rstd, weight, grad_residual), {}, theirs,
                 loose_nonfinite=(0, 1))


@op("_row_moments")
def _row_moments(case):
    x = case.tensor(case.shape(min_dim=1), case.pick("dtype", FLOATS))

    def theirs(x):  # population moments of each row (no degrees-of-freedom warning: correction 0)
        h = x.to(_acc(x))
        mean = h.mean(-1)
        # The variance of the values less the row's first (the two-pass
        # formula on the values themselves gave 8e267 for 12289 equal values
        # of 6e149, whose variance is 0: mean's rounding, squared).
        shifted = h - h[..., :1]
        return mean, (shifted - shifted.mean(-1, keepdim=True)).pow(2).mean(-1)

    return Trial(ops._row_moments, (x,), {}, theirs, loose_nonfinite=(0, 1))


@op("_normalize_rows")
def _normalize_rows(case):
    x = case.tensor(case.shape(min_dim=1), case.pick("dtype", FLOATS))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    mean = None if case.chance("no_mean", 0.3) else case.tensor(x.shape[:-1], acc, "mean", layout="contiguous")
    rstd = case.tensor(x.shape[:-1], acc, "rstd", layout="contiguous", positive=True)
    n = list(x.shape[-1:])
    weight, bias = _param(case, "weight", n, x), _param(case, "bias", n, x)

    def theirs(x, mean, rstd, weight, bias):
        _same_device(x, mean, rstd, weight, bias)
        _contract_params(x, weight, bias)
        for p in (weight, bias):
            if p is not None and list(p.shape) != n:
                raise RuntimeError("parameter shape")
        y = x.to(acc)
        if mean is not None:
            y = y - mean.unsqueeze(-1)
        y = y * rstd.unsqueeze(-1)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y.to(x.dtype)

    return Trial(ops._normalize_rows, (x, mean, rstd, weight, bias), {}, theirs)


# ---- softmax ------------------------------------------------------------


@op("softmax")
def _softmax(case):
    x = case.tensor(case.shape(), case.pick("dtype", FLOATS + [torch.int64]))
    dim = case.dims(x.dim(), optional=False, single=True)
    dtype = case.pick("out_dtype", [None, None, torch.float32, torch.float64])

    def theirs(x, dim, dtype=None):
        if not (dtype or x.dtype).is_floating_point:  # torch checks the dtype only for non-empty input
            raise RuntimeError("softmax of an integer tensor")
        return torch.softmax(x, dim, dtype=dtype)

    return Trial(ops.softmax, (x, dim), {"dtype": dtype}, theirs)


def _grad_and_output(case, forward, fallback):
    """A gradient for the forward's output (`fallback` where the case's
    arguments make the forward raise) and that output, maybe on the CPU."""
    try:
        out = forward()
    except (RuntimeError, IndexError):
        out = fallback
    return case.tensor(out.shape, out.dtype, "grad"), _saved_on_cpu(case, "output", out)


@op("softmax_backward")
def _softmax_backward(case):
    x = case.tensor(case.shape(), case.pick("dtype", FLOATS), special=None)
    dim = case.dims(x.dim(), optional=False, single=True)
    grad, out = _grad_and_output(case, lambda: torch.softmax(x, dim), x)

    def theirs(grad, out, dim):
        _same_device(grad, out)
        return torch._softmax_backward_data(grad, out, dim, out.dtype)

    return Trial(ops.softmax_backward, (grad, out, dim), {}, theirs)


def _causal_ref(scores, scale):
    """SPEC: softmax of the masked scores, and exactly 0 above the diagonal (even in a NaN row)."""
    if scores.dim() < 2 or scores.shape[-2] != scores.shape[-1]:
        raise RuntimeError("scores must be (..., T, T)")
    n = scores.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
    masked = (scores.to(_acc(scores)) * scale).masked_fill(upper, float("-inf"))
    return torch.softmax(masked, -1).masked_fill(upper, 0).to(scores.dtype)


def _causal_scores(case):
    t = case.rng.choice([0, 1, 2, 5, 16, 33, 130])
    batch = [case.rng.choice([1, 2, 3]) for _ in range(case.rng.randint(0, 2))]
    shape = (*batch, t, t) if not case.chance("not_square", 0.05) else (*batch, t, t + 1)
    return case.tensor(shape, case.pick("dtype", FLOATS)), case.pick("scale", [1.0, 0.125, 2.0, -1.0])


@op("causal_softmax")
def _causal_softmax(case):
    scores, scale = _causal_scores(case)
    # Float32 opmath as the kernels, in the input dtype at the end as torch's softmax.
    return Trial(ops.causal_softmax, (scores, scale), {}, _causal_ref)


@op("causal_softmax_backward")
def _causal_softmax_backward(case):
    scores, scale = _causal_scores(case)
    scores = scores.nan_to_num(0.0, 1e4, -1e4)
    grad, out = _grad_and_output(case, lambda: _causal_ref(scores, scale), scores)

    def theirs(grad, out, scale):
        _same_device(grad, out)
        _causal_ref(out, 1.0)  # the shape check
        acc = _acc(out)
        dx = scale * torch._softmax_backward_data(grad.tril().to(acc), out.to(acc), -1, acc)
        return dx.tril().to(out.dtype)  # SPEC: the lower triangle only, exact zeros above

    return Trial(ops.causal_softmax_backward, (grad, out, scale), {}, theirs)


# ---- losses -------------------------------------------------------------


def _targets(case, rows, classes, ignore_index):
    device = case.other_device() if case.other_device() and case.chance("target_on_cpu", 0.08) else case.device
    target = torch.randint(0, max(classes, 1), (rows,), generator=case.generator)
    if rows and case.chance("ignored_rows", 0.3):
        target[torch.rand(rows, generator=case.generator) < 0.4] = ignore_index
    if rows and case.chance("target_out_of_range", 0.06):
        target[0] = classes + case.rng.choice([0, 5])
    if rows and case.chance("negative_target", 0.04):
        target[-1] = -7
    dtype = torch.int64 if not case.chance("int32_target", 0.05) else torch.int32
    case.bad_targets = bool((((target < 0) | (target >= classes)) & (target != ignore_index)).any())
    return target.to(device=device, dtype=dtype)


def _loss_options(case):
    return (case.pick("reduction", ["mean", "sum", "none"]), case.pick("ignore_index", [-100, 0, 3]),
            case.pick("label_smoothing", [0.0, 0.0, 0.1, 1.0]))


def _cross_entropy_ref(x, target, reduction, ignore_index, label_smoothing):
    if x.dim() != 2 or target.dim() != 1 or target.dtype != torch.int64:
        raise RuntimeError("fastreduce's cross_entropy takes (N, V) logits and int64 targets (as torch's CPU)")
    loss = F.cross_entropy(x.to(_acc(x)), target, reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
    return loss.to(x.dtype), torch.logsumexp(x.to(_acc(x)), 1)


@op("cross_entropy")
def _cross_entropy(case):
    rows, classes = case.rng.choice([0, 1, 3, 16, 33]), case.rng.choice([1, 2, 5, 64, 1000, 5003])
    shape = (rows, classes) if not case.chance("not_2d", 0.05) else (rows,)
    x = case.tensor(shape, case.pick("dtype", FLOATS))
    reduction, ignore_index, label_smoothing = _loss_options(case)
    if case.chance("unknown_reduction", 0.03):
        reduction = "average"
    target = _targets(case, rows, classes, ignore_index)
    return Trial(ops.cross_entropy, (x, target, reduction, ignore_index, label_smoothing), {}, _cross_entropy_ref)


@op("cross_entropy_backward")
def _cross_entropy_backward(case):
    rows, classes = case.rng.choice([0, 1, 3, 16, 33]), case.rng.choice([1, 2, 5, 64, 1000, 5003])
    x = case.tensor((rows, classes), case.pick("dtype", FLOATS), special=None)
    reduction, ignore_index, label_smoothing = _loss_options(case)
    target = _targets(case, rows, classes, ignore_index)
    lse = torch.logsumexp(x.to(_acc(x)), 1)
    grad_loss = case.tensor((rows,) if reduction == "none" else (), x.dtype, "grad_loss", layout="contiguous")
    grad_lse = case.tensor((rows,), _acc(x), "grad_lse", layout="contiguous") \
        if case.chance("grad_lse", 0.3) else None
    lse = _saved_on_cpu(case, "lse", lse)

    def theirs(grad_loss, grad_lse, x, target, lse, reduction, ignore_index, label_smoothing):
        _same_device(grad_loss, grad_lse, x, target, lse)
        loss_lse = lambda x: _cross_entropy_ref(x, target, reduction, ignore_index, label_smoothing)  # noqa: E731
        leaf = x.detach().requires_grad_()
        loss, their_lse = loss_lse(leaf)
        outputs, grads = [loss], [grad_loss.to(loss.dtype)]
        if grad_lse is not None:
            outputs.append(their_lse)
            grads.append(grad_lse)
        return torch.autograd.grad(outputs, leaf, grads)[0]

    return Trial(ops.cross_entropy_backward,
                 (grad_loss, grad_lse, x, target, lse, reduction, ignore_index, label_smoothing), {}, theirs,
                 loose_nonfinite=(0,))


@op("_cross_entropy_backward_")
def _cross_entropy_backward_inplace(case):
    """cross_entropy_backward's cases, the gradient written over a contiguous copy of the logits."""
    trial = _cross_entropy_backward(case)

    def ours(grad_loss, grad_lse, x, target, lse, *options):
        logits = x.clone(memory_format=torch.contiguous_format)
        ops._cross_entropy_backward_(logits, grad_loss, grad_lse, target, lse, *options)
        return logits

    trial.ours = ours
    return trial


@op("_cross_entropy_with_grad")
def _cross_entropy_with_grad(case):
    """cross_entropy's cases: the loss and its gradient in one call."""
    trial = _cross_entropy(case)

    def theirs(x, target, reduction, ignore_index, label_smoothing):
        if reduction not in ("mean", "sum"):
            raise RuntimeError("the gradient in the forward needs reduction mean or sum")
        leaf = x.detach().requires_grad_()
        loss, _ = _cross_entropy_ref(leaf, target, reduction, ignore_index, label_smoothing)
        return loss.detach(), torch.autograd.grad(loss, leaf)[0]

    trial.ours, trial.theirs, trial.loose_nonfinite = ops._cross_entropy_with_grad, theirs, (0, 1)
    # Tiny logits: each gradient is softmax - smoothing / classes, which
    # cancel to rounding noise of 1 / classes.
    trial.least_scale = 1 / max(trial.args[0].shape[-1] if trial.args[0].dim() else 1, 1)
    return trial


@op("_cross_entropy_with_grad_")
def _cross_entropy_with_grad_inplace(case):
    """_cross_entropy_with_grad's cases, the gradient written over a contiguous copy of the logits."""
    trial = _cross_entropy_with_grad(case)

    def ours(x, *options):
        logits = x.clone(memory_format=torch.contiguous_format)
        return ops._cross_entropy_with_grad_(logits, *options), logits

    trial.ours = ours
    return trial


@op("_scale_unless_one_")
def _scale_unless_one(case):
    x = case.tensor(case.shape(max_dim=3), case.pick("dtype", FLOATS))
    # The factor in the accumulator type, or the data's own (a loss's incoming gradient).
    factor_dtype = case.pick("factor_dtype", [_acc(x), x.dtype])
    factor = case.tensor((2,) if case.chance("factor_not_one_element", 0.05) else (), factor_dtype, "factor",
                         layout="contiguous", special=None)
    if case.chance("factor_one", 0.3):
        factor = torch.ones_like(factor)
    # A loss's targets: the ignored rows (per_row), or all of x when every target is ignored, left as they are.
    target, ignore_index, per_row = None, case.pick("ignore_index", [-100, 0, 3]), case.chance("per_row", 0.4)
    if per_row or case.chance("with_target", 0.4):
        rows = x.size(0) if x.dim() and not case.chance("target_wrong_rows", 0.05) else case.rng.choice([0, 1, 6])
        target = torch.randint(0, 5, (rows,), generator=case.generator)
        target[torch.rand(rows, generator=case.generator) < case.pick("ignored_share", [0.0, 0.4, 1.0])] = ignore_index
        device = case.other_device() if case.other_device() and case.chance("target_on_cpu", 0.05) else case.device
        target = target.to(device=device, dtype=torch.int32 if case.chance("int32_target", 0.05) else torch.int64)

    def ours(x, factor, target, ignore_index, per_row):
        data = x.clone()  # keeps a dense non-contiguous layout (transposed): refused
        ops._scale_unless_one_(data, factor, target, ignore_index, per_row)
        return data

    def theirs(x, factor, target, ignore_index, per_row):
        _same_device(x, factor)
        if not x.clone().is_contiguous() or factor.numel() != 1:
            raise RuntimeError("contiguous data and a one-element factor")
        if target is not None:
            _same_device(x, target)
            if target.dtype != torch.int64 or target.dim() != 1:
                raise RuntimeError("1-D int64 targets")
        if per_row and (target is None or x.dim() == 0 or x.size(0) != target.size(0)):
            raise RuntimeError("a target a row")
        if factor.item() == 1:
            return x.clone()
        scaled = (x.to(_acc(x)) * factor.to(_acc(x))).to(x.dtype)
        if target is None:
            return scaled
        counts = target != ignore_index
        if per_row:
            return torch.where(counts.view(-1, *[1] * (x.dim() - 1)), scaled, x)
        return scaled if counts.any() else x.clone()

    return Trial(ours, (x, factor, target, ignore_index, per_row), {}, theirs)


def _linear_loss_inputs(case):
    rows, hidden, classes = case.rng.choice([0, 1, 5, 33]), case.rng.choice([1, 8, 24]), case.rng.choice([1, 7, 300])
    dtype = case.pick("dtype", FLOATS)
    # Finite special values only: with inf or NaN the logits are the matmul's
    # (cuBLAS's NaN-or-inf, which differs between its kernels);
    # test_fused_linear_cross_entropy.py checks those against torch.
    h = case.tensor((rows, hidden), dtype, "hidden",
                    special=case.pick("hidden.values", [None, "huge", "tiny", "ties", "zeros"], [12, 1, 1, 1, 1]))
    w = case.tensor((classes, hidden if not case.chance("weight_wrong_shape", 0.05) else hidden + 1), dtype,
                    "weight", special=None)
    b = None if case.chance("no_bias", 0.5) else case.tensor((classes,), dtype, "bias", special=None)
    reduction, ignore_index, label_smoothing = _loss_options(case)
    softcap = case.pick("softcap", [None, None, 30.0, 1.0])
    target = _targets(case, rows, classes, ignore_index)
    return h, w, target, b, reduction, ignore_index, label_smoothing, softcap


def _rounding_decides_softmax(h, w, b, softcap):
    """Whether the matmul's rounding decides the softmax of h @ w.T + b: huge
    logits (a rounding error above 1) with a runner-up within that error of
    its row's largest (tied weight rows, say). Two matmuls that sum in other
    orders then put the probability in other places."""
    if softcap is not None or h.dim() != 2 or w.dim() != 2 or h.shape[1] != w.shape[1] or w.shape[0] < 2:
        return False
    z = h.double() @ w.double().T + (0 if b is None else b.double())
    if h.numel() == 0 or not z.isfinite().all():
        return False
    error = h.shape[1] * torch.finfo(h.dtype).eps * (h.double().abs() @ w.double().abs().T).amax(1)
    top = z.topk(2, 1).values
    return bool(((top[:, 0] - top[:, 1] <= error) & (error > 1)).any())


def _linear_loss_ref(h, w, target, b, reduction, ignore_index, label_smoothing, softcap):
    """The loss as transformers computes it: logits upcast to float32 (float64 stays)."""
    _same_device(h, w, target, b)
    acc = _acc(h)
    logits = F.linear(h, w, b).to(acc)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
    if target.dtype != torch.int64:
        raise RuntimeError("int64 targets (as torch's CPU)")
    return loss, torch.logsumexp(logits, 1)


# Tolerances of the input dtype: the logits are rounded to it on both sides.
@op("fused_linear_cross_entropy")
def _fused_linear_cross_entropy(case):
    args = _linear_loss_inputs(case)
    # Non-finite hidden values: NaN or inf in the logits as the matmul gives them.
    return Trial(ops.fused_linear_cross_entropy, args, {}, _linear_loss_ref, rtol_dtype=args[0].dtype,
                 loose_nonfinite=(0, 1))


@op("_fused_linear_cross_entropy_with_grads")
def _fused_linear_cross_entropy_with_grads(case):
    def theirs(h, w, target, b, reduction, *options):
        if reduction == "none":
            raise RuntimeError("gradients in the forward need reduction mean or sum")
        loss, lse = _linear_loss_ref(h, w, target, b, reduction, *options)
        # The loss's gradients; the autograd node scales them by the incoming one.
        grads = _grads(lambda h, w, b: _linear_loss_ref(h, w, target, b, reduction, *options)[0], (h, w, b),
                       torch.ones_like(loss))
        return (loss, lse, *grads)

    args = _linear_loss_inputs(case)
    h, w, _, b, *_, softcap = args
    return Trial(ops._fused_linear_cross_entropy_with_grads, args, {}, theirs, rtol_dtype=args[0].dtype,
                 loose_nonfinite=(0, 1, 2, 3, 4),
                 rounding_decides=(2, 3, 4) if _rounding_decides_softmax(h, w, b, softcap) else ())


@op("fused_linear_cross_entropy_backward")
def _fused_linear_cross_entropy_backward(case):
    h, w, target, b, reduction, ignore_index, label_smoothing, softcap = _linear_loss_inputs(case)
    options = (reduction, ignore_index, label_smoothing, softcap)
    # The lse of fastreduce's own forward, as autograd saves it: half logits
    # rounded an ulp apart from torch's (another order of the matmul's sums)
    # move exp(logit - lse) by up to 6% against an lse of torch's.
    try:
        lse = ops.fused_linear_cross_entropy(h, w, target.clamp(0, max(w.shape[0] - 1, 0)), b, *options)[1]
    except RuntimeError:
        lse = torch.zeros(h.shape[:1], device=h.device)
    grad_loss = case.tensor((h.shape[0],) if reduction == "none" else (), h.dtype, "grad_loss", layout="contiguous")

    def theirs(grad_loss, h, w, target, b, lse, *options):
        return _grads(lambda h, w, b: _linear_loss_ref(h, w, target, b, *options)[0], (h, w, b), grad_loss)

    return Trial(ops.fused_linear_cross_entropy_backward, (grad_loss, h, w, target, b, lse, *options), {}, theirs,
                 rtol_dtype=h.dtype, loose_nonfinite=(0, 1, 2),
                 rounding_decides=(0, 1, 2) if _rounding_decides_softmax(h, w, b, softcap) else ())


# ---- the kernel ladder --------------------------------------------------


@op("sum_variant")
def _sum_variant(case):
    x = case.tensor(case.shape(max_dim=2), case.pick("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.float64]),
                    layout="contiguous")
    variant = case.pick("variant", fastreduce_torch.variants() + ["no_such_variant"], None)

    def theirs(x, variant):  # the ladder's contract: float32, bfloat16, int32 (into int64)
        if variant not in fastreduce_torch.variants() or x.dtype == torch.float64:
            raise RuntimeError("unknown variant or dtype")
        if x.dtype == torch.int32:
            return torch.sum(x, dtype=torch.int64)
        # Summed in float64 and rounded once: float64 input is refused, so no
        # float64 answer can stand in where torch's own bfloat16 sum drifts
        # (case 12746: 60000 values of +-4e30, torch -2^101, exactly -2.768e30).
        return torch.sum(x, dtype=torch.float64).to(x.dtype)

    # Loose for float32: the ladder's early rungs add in any order (atomics).
    return Trial(ops.sum_variant, (x, variant), {}, theirs,
                 rtol_dtype=torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float16)


@op("_read_probe")
def _read_probe(case):
    """No torch counterpart: a CUDA bandwidth probe that must refuse what it cannot read."""
    x = case.tensor(case.shape(max_dim=2), case.pick("dtype", [torch.float32, torch.float16]), special=None)

    def theirs(x):
        aligned = x.is_contiguous() and x.nbytes % 16 == 0 and x.data_ptr() % 16 == 0
        if x.device.type != "cuda" or not aligned:
            raise RuntimeError("not readable by the probe")
        return None  # any int32 scalar

    return Trial(ops._read_probe, (x,), {}, theirs)


# ---- comparing ----------------------------------------------------------


def _flatten(result):
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in _flatten(item)]
    return [result]


# torch's notes on its own implementation, not on the caller's input.
IMPLEMENTATION_NOTES = ("Cannot dispatch to fused implementation",)


def _outcome(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, error = fn(*args, **kwargs), None
        except Exception as e:  # noqa: BLE001  (any error is an outcome to compare)
            result, error = None, e
    return result, error, [w for w in caught if not any(s in str(w.message) for s in IMPLEMENTATION_NOTES)]


UNCLEAR = ("CUDA error", "illegal memory", "INTERNAL ASSERT", "Segmentation", "cudaError")


def _compare_tensor(i, ours, theirs, rtol_dtype, scale, loose=False, values=True):
    if theirs is None:
        if ours is not None and ours.numel() != 0:
            return f"output {i}: torch gives no tensor, fastreduce one of shape {tuple(ours.shape)}"
        return None
    if not isinstance(theirs, torch.Tensor):
        return None if ours is not None else f"output {i}: missing"
    if not isinstance(ours, torch.Tensor):
        return f"output {i}: torch gives a tensor, fastreduce {type(ours).__name__}"
    if (ours.dtype, tuple(ours.shape), ours.device) != (theirs.dtype, tuple(theirs.shape), theirs.device):
        return (f"output {i}: fastreduce {_show(ours.dtype)} {tuple(ours.shape)} {ours.device}, "
                f"torch {_show(theirs.dtype)} {tuple(theirs.shape)} {theirs.device}")
    if not theirs.dtype.is_floating_point:
        if not torch.equal(ours.cpu(), theirs.cpu()):
            return f"output {i}: values differ: fastreduce {ours.flatten()[:8].tolist()} torch {theirs.flatten()[:8].tolist()}"
        return None
    a, b = ours.double().cpu(), theirs.double().cpu()
    classes = ((("non-finite", lambda t: ~t.isfinite()),) if loose else
               (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)))
    for name, where in classes:
        if not torch.equal(where(a), where(b)):
            first = (where(a) != where(b)).nonzero()[0].tolist()
            return f"output {i}: {name} in different places (first at {first}: fastreduce {a[tuple(first)].item()}, torch {b[tuple(first)].item()})"
    finite = b.isfinite()
    if values and finite.any():
        rtol = RTOL[rtol_dtype or theirs.dtype]
        largest = max(b[finite].abs().max().item(), scale)
        error = (a[finite] - b[finite]).abs() - rtol * b[finite].abs()
        worst = error.max().item()
        if worst > rtol * largest + 1e-300:
            return f"output {i}: values differ by {worst:.3g} beyond tolerance (rtol {rtol}, largest {largest:.3g})"
    return None


def _compare_outputs(trial, case, ours, theirs):
    ours_flat, theirs_flat = _flatten(ours), _flatten(theirs)
    if len(ours_flat) != len(theirs_flat):
        return f"fastreduce returns {len(ours_flat)} outputs, torch {len(theirs_flat)}"
    scale = max(case.scale ** trial.scale_power, trial.least_scale)
    for i, (a, b) in enumerate(zip(ours_flat, theirs_flat)):
        problem = _compare_tensor(i, a, b, trial.rtol_dtype, scale, i in trial.loose_nonfinite,
                                  i not in trial.rounding_decides) \
            if isinstance(b, torch.Tensor) or b is None else (None if a == b else f"output {i}: {a} against {b}")
        if problem:
            return problem
    return None


def _their_answer(trial, theirs, move, move_dtype=lambda d: d):
    """torch's answer to the trial's inputs passed through `move` (and a
    floating output dtype through `move_dtype`), in the dtypes and on the
    device of `theirs`; None where torch has no answer to them."""
    def moved(value):
        if isinstance(value, torch.Tensor):
            return move(value)
        if isinstance(value, (list, tuple)):
            return type(value)(moved(v) for v in value)
        return value

    def moved_kwargs(kwargs):
        if kwargs is None:
            return None
        return {k: moved(move_dtype(v) if k == "dtype" and v in FLOATS else v) for k, v in kwargs.items()}

    other = Trial(trial.ours, moved(trial.args), moved_kwargs(trial.kwargs), trial.theirs,
                  None if trial.their_args is None else moved(trial.their_args), moved_kwargs(trial.their_kwargs))
    try:
        answer = _flatten(other.run_theirs())
    except Exception:  # noqa: BLE001  (no answer to compare with)
        return None
    expected = _flatten(theirs)
    if len(answer) != len(expected):
        return None
    return [a.to(t.device, t.dtype) if isinstance(a, torch.Tensor) and isinstance(t, torch.Tensor) else t
            for a, t in zip(answer, expected)]


def _in_float64(trial, theirs):
    """torch's answer from float64 inputs (a floating output dtype widened too:
    torch refuses to narrow float64 input into it)."""
    return _their_answer(trial, theirs, lambda t: t.double() if t.dtype in FLOATS else t, lambda d: torch.float64)


def _on_the_cpu(trial, theirs):
    """torch's CPU answer to a CUDA case's inputs: where torch's two backends
    differ (its CUDA rms_norm backward's NaN weight gradient of a row of inf,
    where its CPU gives 0), matching either is torch's behaviour."""
    return _their_answer(trial, theirs, lambda t: t.cpu())


def _fake_check(trial, results):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()

    def fake(value):
        if isinstance(value, torch.Tensor):
            return mode.from_tensor(value)
        if isinstance(value, (list, tuple)):
            return type(value)(fake(v) for v in value)
        return value

    faked_trial = replace(trial, args=fake(trial.args), kwargs={k: fake(v) for k, v in trial.kwargs.items()})
    try:
        with mode:
            faked = trial.ours(*faked_trial.args, **faked_trial.kwargs)
    except Exception as error:  # noqa: BLE001
        return f"the fake kernel raises where the operator returns: {type(error).__name__}: {str(error)[:200]}"
    if shared := _shared_storage(faked_trial, faked):
        return "fake " + shared
    for i, (f, r) in enumerate(zip(_flatten(faked), _flatten(results))):
        if isinstance(r, torch.Tensor) and (f.dtype, tuple(f.shape), f.device) != (r.dtype, tuple(r.shape), r.device):
            return (f"fake output {i}: {_show(f.dtype)} {tuple(f.shape)} {f.device}, "
                    f"real {_show(r.dtype)} {tuple(r.shape)} {r.device}")
    return None


def _shared_storage(trial, results):
    """An output that shares storage with an input or another output: a custom
    operator may return neither (torch.compile raises from torch 2.12)."""
    def storage(t):
        return t.untyped_storage()._cdata

    inputs = {storage(t) for t in _flatten([trial.args, list(trial.kwargs.values())]) if isinstance(t, torch.Tensor)}
    outputs = set()
    for i, r in enumerate(_flatten(results)):
        if not isinstance(r, torch.Tensor):
            continue
        if storage(r) in inputs:
            return f"output {i} shares storage with an input"
        if storage(r) in outputs:
            return f"output {i} shares storage with an earlier output"
        outputs.add(storage(r))
    return None


def _unchecked_targets(op_name, trial):
    """A bad class index on CUDA: torch's kernels stop the process with a device
    assert; fastreduce's cannot check without a host sync, so its loss is NaN
    (its backward ops' values are unspecified). Either way, no crash."""
    ours, error, _ = _outcome(trial.ours, *trial.args, **trial.kwargs)
    torch.cuda.synchronize()
    if error is not None:
        return None if not any(s in str(error) for s in UNCLEAR) else f"unclear error: {error}"
    if "backward" in op_name or "with_grads" in op_name:
        return None
    return None if _flatten(ours)[0].isnan().any() else "a bad target on CUDA gives no NaN loss"


def check(op_name: str, index: int, device: str, verbose=False, drawn_as=None):
    """None when the case holds, else what differs."""
    case = Case(op_name, index, device, drawn_as)
    trial = OPS[op_name](case)
    if case.bad_targets and device != "cpu":
        return _unchecked_targets(op_name, trial)
    theirs, their_error, their_warnings = _outcome(trial.run_theirs)
    ours, our_error, our_warnings = _outcome(trial.ours, *trial.args, **trial.kwargs)
    if verbose:
        print("case:", " ".join(case.labels))
        print("torch:", repr(their_error) if their_error else theirs)
        print("fastreduce:", repr(our_error) if our_error else ours)
    if our_error is not None and any(s in str(our_error) for s in UNCLEAR):
        return f"unclear error: {type(our_error).__name__}: {str(our_error)[:300]}"
    if their_error is not None and any(s in str(their_error) for s in UNCLEAR):
        return f"unclear error: torch's reference: {str(their_error)[:300]}"
    if their_error is not None:
        if our_error is None:
            return f"torch raises ({type(their_error).__name__}: {str(their_error)[:200]}), fastreduce returns"
        if not str(our_error).strip():
            return f"fastreduce raises {type(our_error).__name__} with no message"
        return None
    if our_error is not None:
        return f"torch returns, fastreduce raises {type(our_error).__name__}: {str(our_error)[:300]}"
    if op_name == "_read_probe":
        return None if ours.dtype == torch.int32 and ours.dim() == 0 else f"probe gives {ours}"
    problem = _compare_outputs(trial, case, ours, theirs)
    if problem:
        references = (_in_float64, _on_the_cpu) if device != "cpu" else (_in_float64,)
        for other in references:
            answer = other(trial, theirs)
            if answer is not None and _compare_outputs(trial, case, ours, answer) is None:
                problem = None  # closer to the float64 result (an underflow torch has, say), or torch's CPU's
                break
    if problem:
        return problem
    if shared := _shared_storage(trial, ours):
        return shared
    if their_warnings and not our_warnings:
        return f"torch warns ({their_warnings[0].message}), fastreduce does not"
    if trial.fake:
        return _fake_check(trial, ours)
    return None


def describe(op_name: str, index: int, device: str, drawn_as: str | None = None) -> str:
    case = Case(op_name, index, device, drawn_as)
    OPS[op_name](case)
    return " ".join(case.labels)


def reproducer(op_name: str, index: int, device: str) -> str:
    return f"python tests/fuzz.py --device {device} --op {op_name} --case {index}"


def worker(device: str, jobs: list[tuple[str, int]]):
    """Runs the jobs in order, one line each: `start OP I`, then `ok` or `fail MESSAGE`.
    Exits after an unclear (CUDA) error, whose context may be lost."""
    for op_name, index in jobs:
        print(f"start {op_name} {index}", flush=True)
        try:
            problem = check(op_name, index, device)
        except Exception as error:  # noqa: BLE001  (a generator bug fails the case, named)
            problem = f"the case itself raised {type(error).__name__}: {error}"
        print("ok" if problem is None else "fail " + problem.replace("\n", " "), flush=True)
        if problem and problem.startswith("unclear error"):
            sys.exit(3)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--op", choices=sorted(OPS))
    parser.add_argument("--case", type=int)
    parser.add_argument("--drawn-as", help="draw the case of this device (a CUDA case's inputs on the CPU)")
    parser.add_argument("--worker", action="store_true", help="read `OP I` jobs from stdin (tests/fuzz_runner.py)")
    args = parser.parse_args()
    if args.worker:
        worker(args.device, [(line.split()[0], int(line.split()[1])) for line in sys.stdin if line.strip()])
        return
    problem = check(args.op, args.case, args.device, verbose=True, drawn_as=args.drawn_as)
    print("holds" if problem is None else f"FAILS: {problem}")
    sys.exit(0 if problem is None else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "always")
    main()
