"""fastreduce operators on DTensors (torch.distributed.tensor).

Two parts:

* Sharding rules for every operator, registered with
  ``torch.distributed.tensor.experimental.register_sharding``: a reduction
  over a sharded dim runs on the local shard and returns a ``Partial`` that
  DTensor finishes with one collective (sum, max, min, product; mean as an
  average where the shards are even); a reduction over other dims, and the
  norms, softmax and cross-entropy on tensors sharded along dims they do not
  normalise, run locally with no communication. Anything else (a sharded
  normalised dim outside the cases below) is replicated first by DTensor.

* Tensor-parallel rows: layer_norm, rms_norm and softmax on a DTensor whose
  normalised (last) dim is sharded compute per-row partial statistics on the
  local shard, exchange only those, and normalise locally. Bytes each rank
  sends per row and pass (float32 statistics): layer_norm forward 8 (its
  slice's mean and variance, all-gathered and merged exactly as Chan et al.;
  no sum of squares to cancel), rms_norm forward 4 (the mean square),
  softmax forward 8 (max, then sum of exponentials), layer_norm backward 8
  (two row sums in one all-reduce), rms_norm and softmax backward 4. The
  norms' forward runs two kernels (``_row_moments``, then
  ``_normalize_rows`` with the merged statistics). The wrappers in norms.py
  route such DTensors here.

Importing fastreduce_torch registers the rules when torch.distributed is
available.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor.experimental import register_sharding

from . import reductions

_ops = torch.ops.fastreduce


# ---- sharding rules (single mesh dim; DTensor expands them over the mesh)


def _rule(op):
    """register_sharding, keyed on every argument. register_sharding makes
    only int arguments part of DTensor's sharding cache key, so a rule for
    `sum(x, dim=[1])` would be reused for `sum(x, dim=None)`; every argument
    after the first (dims, shapes, flags, reduction) decides the placements."""
    def wrap(fn):
        register_sharding(op)(fn)
        kwarg_only = [a.name for a in op._schema.arguments if a.kwarg_only]
        DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(
            1, kwarg_only or None, needs_pytree=True)
        return fn

    return wrap


def _present(*tensors) -> list:
    """Placements are listed for the tensor arguments actually given."""
    return [t for t in tensors if t is not None]


def _reduced_dims(spec, dim) -> set[int]:
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return set(range(spec.ndim))
    dims = [dim] if isinstance(dim, int) else dim
    return {d % spec.ndim for d in dims} if spec.ndim else set()


def _reduction_strategies(self, dim, keepdim, partial_ops: Sequence[str] | None, outputs: int = 1,
                          even_only: bool = False):
    """Local over kept dims; over a reduced dim, Partial(op) per output when
    `partial_ops` says how the shards' results merge, else replicated first."""
    reduced = _reduced_dims(self, dim)
    strategies = [([Replicate()] * outputs, [Replicate()])]
    for d in range(self.ndim):
        if d in reduced:
            if partial_ops is not None and (not even_only or self.shape[d] % self.mesh.size() == 0):
                strategies.append(([Partial(op) for op in partial_ops], [Shard(d)]))
        else:
            out = d if keepdim else d - sum(r < d for r in reduced)
            strategies.append(([Shard(out)] * outputs, [Shard(d)]))
    return strategies


def _reduction_rule(partial_op: str | None, even_only: bool = False, outputs: int = 1):
    def rule(self, dim=None, keepdim=False, *args, **kwargs):
        partial_ops = None if partial_op is None else [partial_op] * outputs
        return _reduction_strategies(self, dim, keepdim, partial_ops, outputs, even_only)

    return rule


_rule(_ops.sum.default)(_reduction_rule("sum"))
_rule(_ops.amax.default)(_reduction_rule("max"))
_rule(_ops.amin.default)(_reduction_rule("min"))
# The local mean divides by the local count: averaging the shards' means is
# the global mean only when every shard has the same count.
_rule(_ops.mean.default)(_reduction_rule("avg", even_only=True))
# A product over shards needs a product all-reduce, which NCCL and gloo have
# but DTensor's Partial does not: replicate first.
_rule(_ops.prod.default)(_reduction_rule(None))
# var/std, logsumexp, norm, argmax/argmin and any/all of shards do not merge
# by a sum, max or min of their results: a sharded reduced dim is replicated
# first; kept dims stay local.
for _op in (_ops.var, _ops.std, _ops.logsumexp, _ops.argmax, _ops.argmin):
    _rule(_op.default)(_reduction_rule(None))
_rule(_ops.var_mean.default)(_reduction_rule(None, outputs=2))
_rule(_ops.std_mean.default)(_reduction_rule(None, outputs=2))
# any/all: bools have no max/min all-reduce in every backend; replicated.
_rule(_ops.any.default)(_reduction_rule(None))
_rule(_ops.all.default)(_reduction_rule(None))


@_rule(_ops.aminmax.default)
def _aminmax_rule(self, dim=None, keepdim=False):
    return _reduction_strategies(self, dim, keepdim, ["min", "max"], outputs=2)


@_rule(_ops.norm.default)
def _norm_rule(self, ord=2, dim=None, keepdim=False, dtype=None):
    return _reduction_strategies(self, dim, keepdim, None)


@_rule(_ops.prod_backward.default)
def _prod_backward_rule(grad, self, result, dim=None, keepdim=False):
    reduced = _reduced_dims(self, dim)
    strategies = [([Replicate()], [Replicate()] * 3)]
    for d in range(self.ndim):
        if d not in reduced:
            out = d if keepdim else d - sum(r < d for r in reduced)
            strategies.append(([Shard(d)], [Shard(out), Shard(d), Shard(out)]))
    return strategies


ROW, PARAM = "row", "param"


def _row_rule(outputs: int, rows: int, args: list, param_grads: int = 0):
    """Rows split along one of their leading dims: every row tensor is sharded
    alike, parameters replicated; parameter gradients are partial sums.
    args: (tensor or None, ROW or PARAM) in the schema's order."""
    kinds = [kind for tensor, kind in args if tensor is not None]
    strategies = [([Replicate()] * (outputs + param_grads), [Replicate()] * len(kinds))]
    for d in range(rows):
        out = [Shard(d)] * outputs + [Partial()] * param_grads
        strategies.append((out, [Shard(d) if kind == ROW else Replicate() for kind in kinds]))
    return strategies


@_rule(_ops.layer_norm.default)
def _layer_norm_rule(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _row_rule(3, input.ndim - len(normalized_shape), [(input, ROW), (weight, PARAM), (bias, PARAM)])


@_rule(_ops.rms_norm.default)
def _rms_norm_rule(input, normalized_shape, weight=None, eps=None):
    return _row_rule(2, input.ndim - len(normalized_shape), [(input, ROW), (weight, PARAM)])


@_rule(_ops.add_layer_norm.default)
def _add_layer_norm_rule(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    args = [(input, ROW), (residual, ROW), (weight, PARAM), (bias, PARAM)]
    return _row_rule(4, input.ndim - len(normalized_shape), args)


@_rule(_ops.add_rms_norm.default)
def _add_rms_norm_rule(input, residual, normalized_shape, weight=None, eps=None):
    return _row_rule(3, input.ndim - len(normalized_shape), [(input, ROW), (residual, ROW), (weight, PARAM)])


@_rule(_ops.layer_norm_backward.default)
def _layer_norm_backward_rule(grad_out, input, normalized_shape, mean, rstd, weight, bias, grad_residual=None):
    args = [(grad_out, ROW), (input, ROW), (mean, ROW), (rstd, ROW), (weight, PARAM), (bias, PARAM),
            (grad_residual, ROW)]
    return _row_rule(1, input.ndim - len(normalized_shape), args, param_grads=2)


@_rule(_ops.rms_norm_backward.default)
def _rms_norm_backward_rule(grad_out, input, normalized_shape, rstd, weight, grad_residual=None):
    args = [(grad_out, ROW), (input, ROW), (rstd, ROW), (weight, PARAM), (grad_residual, ROW)]
    return _row_rule(1, input.ndim - len(normalized_shape), args, param_grads=1)


def _other_dims_rule(tensors: int, ndim: int, kept: Sequence[int]):
    return [([Replicate()], [Replicate()] * tensors)] + [
        ([Shard(d)], [Shard(d)] * tensors) for d in range(ndim) if d not in kept
    ]


@_rule(_ops.softmax.default)
def _softmax_rule(self, dim=-1, dtype=None):
    return _other_dims_rule(1, self.ndim, [dim % self.ndim])


@_rule(_ops.softmax_backward.default)
def _softmax_backward_rule(grad_output, output, dim):
    return _other_dims_rule(2, output.ndim, [dim % output.ndim])


@_rule(_ops.causal_softmax.default)
def _causal_softmax_rule(scores, scale=1.0):
    return _other_dims_rule(1, scores.ndim, [scores.ndim - 2, scores.ndim - 1])


@_rule(_ops.causal_softmax_backward.default)
def _causal_softmax_backward_rule(grad_output, output, scale):
    return _other_dims_rule(2, output.ndim, [output.ndim - 2, output.ndim - 1])


@_rule(_ops.cross_entropy.default)
def _cross_entropy_rule(input, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    strategies = [([Replicate(), Replicate()], [Replicate(), Replicate()])]
    # A mean divides by the kept rows of all shards: only replicated.
    if reduction == "none":
        strategies.append(([Shard(0), Shard(0)], [Shard(0), Shard(0)]))
    elif reduction == "sum":
        strategies.append(([Partial(), Shard(0)], [Shard(0), Shard(0)]))
    return strategies


@_rule(_ops.cross_entropy_backward.default)
def _cross_entropy_backward_rule(grad_loss, grad_lse, input, target, lse, reduction, ignore_index,
                                 label_smoothing):
    given = _present(grad_loss, grad_lse, input, target, lse)
    strategies = [([Replicate()], [Replicate()] * len(given))]
    if reduction in ("none", "sum"):
        loss = Shard(0) if reduction == "none" else Replicate()
        placements = [loss] + [Shard(0)] * (len(given) - 1)
        strategies.append(([Shard(0)], placements))
    return strategies


# ---- tensor-parallel rows: the normalised dim sharded


def sharded_row_dim(input: Tensor, normalized_dims: int = 1) -> int | None:
    """The mesh dim along which a DTensor's last dim is sharded, when that is
    the only normalised dim and the only sharding of it; else None."""
    if not isinstance(input, DTensor) or normalized_dims != 1:
        return None
    last = input.ndim - 1
    sharding = [i for i, p in enumerate(input.placements) if isinstance(p, Shard) and p.dim % input.ndim == last]
    if len(sharding) != 1 or any(isinstance(p, Partial) for p in input.placements):
        return None
    return sharding[0]


def _local_param(param, input: DTensor, mesh_dim: int) -> Tensor | None:
    """The slice of a (hidden,) parameter that matches the local shard of the
    input's last dim, differentiably: a DTensor is redistributed to the
    input's sharding (Replicate to Shard is a local slice), a plain tensor is
    distributed first (replicated)."""
    if param is None:
        return None
    if not isinstance(param, DTensor):
        param = DTensor.from_local(param, input.device_mesh, [Replicate()] * input.device_mesh.ndim,
                                   run_check=False)
    placements = [Shard(0) if i == mesh_dim else Replicate() for i in range(input.device_mesh.ndim)]
    return param.redistribute(input.device_mesh, placements).to_local()


def _row_sum(t: Tensor) -> Tensor:
    return reductions.sum(t, -1, keepdim=True)


def _widen(t: Tensor) -> Tensor:
    """Statistics in float32 (float64 for float64 input), as the kernels."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _shard_lengths(n: int, shards: int) -> list[int]:
    """The lengths of a dim of n split in `shards` as DTensor's Shard splits
    it (torch.chunk's pieces, empty ones at the end)."""
    piece = -(-n // shards)
    return [max(0, min(piece, n - i * piece)) for i in range(shards)]


@functools.lru_cache(maxsize=64)
def _shares(lengths: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """Each rank's fraction of the row, on the device: made once, as the copy
    to the device waits for the stream."""
    return torch.tensor(lengths, dtype=dtype).div_(sum(lengths)).to(device)


class _ShardedNorm(torch.autograd.Function):
    """layer_norm (centered) or rms_norm over a last dim split across a
    process group; x is the local shard, lengths every rank's slice length.
    Forward: one read of x for the slice's (mean, variance), one exchange of
    those, one read and write to normalise."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, centered, group, lengths):
        n = sum(lengths)
        mean, var = _ops._row_moments(x)
        if x.shape[-1] == 0:  # an empty slice adds nothing (its moments are NaN)
            mean, var = mean.zero_(), var.zero_()
        if centered:
            # Each rank's (mean, var), 8 bytes a row, merged exactly (Chan et al.).
            gathered = mean.new_empty((len(lengths) * 2,) + tuple(mean.shape))
            dist.all_gather_into_tensor(gathered, torch.stack([mean, var]), group=group)
            share = _shares(tuple(lengths), mean.device, mean.dtype).view((-1,) + (1,) * mean.dim())
            means, variances = gathered.view((len(lengths), 2) + tuple(mean.shape)).unbind(1)
            mean = (means * share).sum(0)
            var = ((variances + (means - mean) ** 2) * share).sum(0)
        else:
            mean_square = (var + mean * mean) * (x.shape[-1] / n)
            dist.all_reduce(mean_square, group=group)
            mean, var = None, mean_square
        rstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.group, ctx.n, ctx.has_bias = group, n, bias is not None
        return _ops._normalize_rows(x, mean, rstd, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, weight = ctx.saved_tensors
        rstd = rstd.unsqueeze(-1)
        xhat = (_widen(x) - mean.unsqueeze(-1)) * rstd if mean is not None else _widen(x) * rstd
        dyf = dy.to(xhat.dtype)
        g = dyf * weight.to(xhat.dtype) if weight is not None else dyf
        rows = tuple(range(dy.dim() - 1))
        if mean is not None:
            sums = torch.cat([_row_sum(g), _row_sum(g * xhat)], -1)  # one all-reduce of 2 floats per row
            dist.all_reduce(sums, group=ctx.group)
            dx = rstd * (g - sums[..., :1] / ctx.n - xhat * (sums[..., 1:] / ctx.n))
        else:
            dot = _row_sum(g * xhat)
            dist.all_reduce(dot, group=ctx.group)
            dx = rstd * (g - xhat * (dot / ctx.n))
        dweight = (dyf * xhat).sum(rows).to(weight.dtype) if weight is not None else None
        dbias = dyf.sum(rows).to(dy.dtype) if ctx.has_bias else None
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None


class _ShardedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        xf = _widen(x)
        if xf.shape[-1]:
            row_max = reductions.amax(xf, -1, keepdim=True)
        else:  # an empty slice: no maximum of its own
            row_max = xf.new_full(xf.shape[:-1] + (1,), -torch.inf)
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(xf - row_max)
        total = _row_sum(e)
        dist.all_reduce(total, group=group)
        y = (e / total).to(x.dtype)
        ctx.save_for_backward(y)
        ctx.group = group
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        yf, dyf = _widen(y), _widen(dy)
        dot = _row_sum(dyf * yf)
        dist.all_reduce(dot, group=ctx.group)
        return (yf * (dyf - dot)).to(dy.dtype), None


def sharded_norm(input: DTensor, mesh_dim: int, weight, bias, eps: float, centered: bool) -> DTensor:
    """layer_norm (centered) or rms_norm of a DTensor whose last dim is
    sharded along mesh dim ``mesh_dim``; the result has the input's sharding."""
    mesh = input.device_mesh
    out = _ShardedNorm.apply(input.to_local(), _local_param(weight, input, mesh_dim),
                             _local_param(bias, input, mesh_dim), eps, centered, mesh.get_group(mesh_dim),
                             _shard_lengths(input.shape[-1], mesh.size(mesh_dim)))
    return DTensor.from_local(out, mesh, input.placements, run_check=False, shape=input.shape,
                              stride=input.stride())


def sharded_softmax(input: DTensor, mesh_dim: int) -> DTensor:
    """softmax over the last dim of a DTensor sharded along it."""
    mesh = input.device_mesh
    out = _ShardedSoftmax.apply(input.to_local(), mesh.get_group(mesh_dim))
    return DTensor.from_local(out, mesh, input.placements, run_check=False, shape=input.shape,
                              stride=input.stride())
