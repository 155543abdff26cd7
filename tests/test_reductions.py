"""sum/mean/prod/amax/amin against torch and a float64 reference."""

import subprocess
import sys

import pytest
import torch

import fastreduce_torch as fr
from conftest import DEVICES, captures_graphs, offset_view, random_tensor, requires_cuda

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
LENGTHS = [1, 31, 32, 33, 1025, 2**20 + 3]

ACC_EPS = {torch.float64: 2.0**-52}  # float32 accumulation otherwise


def check_sum_like(ours, x, torch_fn):
    """Float results: our error against float64 within twice torch's own error,
    plus the rounding bound of the accumulator over sum(|x|)."""
    reference = torch_fn(x.double())
    theirs = torch_fn(x).double()
    scale = torch_fn(x.double().abs())
    acc_eps = ACC_EPS.get(x.dtype, 2.0**-23)
    out_eps = torch.finfo(ours.dtype).eps
    tolerance = 2 * (theirs - reference).abs() + 4 * acc_eps * scale + out_eps * reference.abs() + 1e-30
    error = (ours.double() - reference).abs()
    assert ours.dtype == torch_fn(x).dtype and ours.shape == reference.shape
    assert bool((error <= tolerance).all()), f"max error {error.max()} over tolerance"


def check_exact(ours, expected):
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_full_reductions_float(device, n, dtype):
    x = random_tensor(n, dtype, device)
    check_sum_like(fr.sum(x), x, torch.sum)
    check_sum_like(fr.mean(x), x, torch.mean)
    check_exact(fr.amax(x), torch.amax(x))
    check_exact(fr.amin(x), torch.amin(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", INTEGERS)
def test_full_reductions_integer(device, n, dtype):
    x = random_tensor(n, dtype, device)
    check_exact(fr.sum(x), torch.sum(x))
    check_exact(fr.amax(x), torch.amax(x))
    check_exact(fr.amin(x), torch.amin(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 33, 1025, 2**20 + 3])
def test_prod(device, n):
    x = 1 + 0.01 * torch.randn(n, device=device, dtype=torch.float64)
    torch.testing.assert_close(fr.prod(x), torch.prod(x), rtol=1e-12, atol=0)
    signs = torch.where(torch.rand(n, device=device) < 0.5, -1, 1)
    ints = torch.where(torch.rand(n, device=device) < 20 / n, 2, signs).to(torch.int32)
    check_exact(fr.prod(ints), torch.prod(ints))
    check_exact(fr.prod(ints.bool()), torch.prod(ints.bool()))
    x32 = x.float()
    ours = fr.prod(x32).double()
    assert abs(ours / torch.prod(x) - 1) < 1e-3


SHAPE = (5, 33, 17)
DIMS = [0, 1, 2, -1, [0, 1], [1, 2], [0, 2], [0, 1, 2], [], None, (2, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_dims(device, dim, keepdim):
    x = random_tensor(SHAPE, torch.float32, device)
    check_sum_like(fr.sum(x, dim, keepdim), x, lambda t: torch.sum(t, dim, keepdim))
    check_sum_like(fr.mean(x, dim, keepdim), x, lambda t: torch.mean(t, dim, keepdim))
    extremum_dim = () if dim is None else dim
    check_exact(fr.amax(x, extremum_dim, keepdim), torch.amax(x, extremum_dim, keepdim))
    check_exact(fr.amin(x, extremum_dim, keepdim), torch.amin(x, extremum_dim, keepdim))
    ints = random_tensor(SHAPE, torch.int32, device, -3, 3)
    check_exact(fr.sum(ints, dim, keepdim), torch.sum(ints, dim, keepdim))
    signs = torch.where(ints >= 0, 1, -1).to(torch.int64)
    expected = signs
    dims = [0, 1, 2] if dim is None or dim == [] else [dim] if isinstance(dim, int) else dim
    for d in sorted([d % 3 for d in dims], reverse=True):
        expected = torch.prod(expected, d, keepdim=True)
    if not keepdim:
        expected = expected.reshape(torch.sum(ints, dim, keepdim).shape)
    check_exact(fr.prod(signs, dim, keepdim), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_dims_all_dtypes(device, dtype, dim):
    x = random_tensor((67, 130), dtype, device)
    if dtype.is_floating_point:
        check_sum_like(fr.sum(x, dim), x, lambda t: torch.sum(t, dim))
        check_sum_like(fr.mean(x, dim), x, lambda t: torch.mean(t, dim))
    else:
        check_exact(fr.sum(x, dim), torch.sum(x, dim))
    check_exact(fr.amax(x, dim), torch.amax(x, dim))
    check_exact(fr.amin(x, dim), torch.amin(x, dim))


# Shapes reaching each plan: tall columns of every tile width (narrow
# matrices take narrower tiles, packed or not), few long rows split over
# several blocks each (one launch), rows just past the team length.
PLAN_SHAPES = [(4099, 2), (8191, 4), (20000, 24), (9000, 48), (5000, 96), (65536, 128), (3000, 130), (2049, 768),
               (1, 2**18 + 5), (3, 70001), (128, 65536), (300, 9000), (600, 1025)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", PLAN_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int16, torch.int32])
def test_plan_shapes(device, shape, dtype):
    x = random_tensor(shape, dtype, device)
    for dim in (0, 1):
        if dtype.is_floating_point:
            check_sum_like(fr.sum(x, dim), x, lambda t, dim=dim: torch.sum(t, dim))
            check_sum_like(fr.mean(x, dim), x, lambda t, dim=dim: torch.mean(t, dim))
        else:
            check_exact(fr.sum(x, dim), torch.sum(x, dim))
        check_exact(fr.amax(x, dim), torch.amax(x, dim))
    check_exact(fr.amin(offset_view(x, 1), 1), torch.amin(offset_view(x, 1), 1))


LAYOUTS = {
    "transposed": lambda x: x.transpose(0, 2),
    "sliced": lambda x: x[1:, ::2, 3:],
    "expanded": lambda x: x[:, :1, :].expand(-1, 40, -1),
    "offset1": lambda x: offset_view(x, 1),
    "offset3": lambda x: offset_view(x, 3),
    "permuted": lambda x: x.permute(1, 2, 0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [None, 0, 1, 2, [0, 2], [1, 2]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_strided_inputs(device, layout, dim, dtype):
    x = LAYOUTS[layout](random_tensor((9, 66, 35), dtype, device))
    if dtype.is_floating_point:
        check_sum_like(fr.sum(x, dim), x, lambda t: torch.sum(t, dim))
    else:
        check_exact(fr.sum(x, dim), torch.sum(x, dim))
    extremum_dim = () if dim is None else dim
    check_exact(fr.amax(x, extremum_dim), torch.amax(x, extremum_dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 3])
def test_offset_long_vector(device, offset):
    x = offset_view(random_tensor(2**20 + 3, torch.float32, device), offset)
    check_sum_like(fr.sum(x), x, torch.sum)
    check_exact(fr.amax(x), torch.amax(x))


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_and_empty(device):
    s = torch.tensor(2.5, device=device)
    check_exact(fr.sum(s), torch.sum(s))
    check_exact(fr.sum(s, 0, True), torch.sum(s, 0, True))
    check_exact(fr.amax(s, 0), torch.amax(s, 0))
    e = torch.empty(0, 3, device=device)
    check_exact(fr.sum(e), torch.sum(e))
    check_exact(fr.sum(e, 0), torch.sum(e, 0))
    check_exact(fr.prod(e, 0), torch.prod(e, 0))
    check_exact(fr.sum(e.int(), 1), torch.sum(e.int(), 1))
    assert torch.isnan(fr.mean(e)).item() and fr.mean(e, 0).isnan().all()
    check_exact(fr.amax(e, 1), torch.amax(e, 1))
    with pytest.raises(IndexError, match="non-zero size"):
        fr.amax(e, 0)
    with pytest.raises(RuntimeError, match="reduction dim to be specified"):
        fr.amin(e)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf(device):
    x = random_tensor(1000, torch.float32, device)
    x[417] = float("nan")
    assert fr.amax(x).isnan() and fr.amin(x).isnan() and fr.sum(x).isnan()
    rows = random_tensor((4, 100), torch.float32, device)
    rows[2, 50] = float("nan")
    check_exact(fr.amax(rows, 1).isnan(), torch.amax(rows, 1).isnan())
    y = torch.tensor([1.0, float("inf"), -3.0], device=device)
    assert fr.amax(y).item() == float("inf") and fr.sum(y).item() == float("inf")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extremes_propagate_nan_on_every_path(device, dtype):
    # A NaN (and infinities) planted where each plan's folds meet it: a full
    # reduction over several blocks, long rows, tall and wide columns.
    cases = [((1 << 20) + 3, None), ((64, 4099), 1), ((4099, 130), 0), ((33, 8193), 0)]
    for shape, dim in cases:
        x = random_tensor(shape, dtype, device)
        flat = x.view(-1)
        flat[flat.numel() // 3] = float("nan")
        flat[flat.numel() // 2] = float("inf")
        flat[flat.numel() // 2 + 1] = -float("inf")
        if dim is not None:
            x.select(1 - dim, 5).fill_(float("nan"))  # a whole output of NaNs beside partly-NaN ones
        reduce_dims = [] if dim is None else [dim]
        low, high = fr.aminmax(x, dim=dim)
        expected = torch.aminmax(x, dim=dim)
        pairs = [(fr.amax(x, reduce_dims), torch.amax(x, reduce_dims)),
                 (fr.amin(x, reduce_dims), torch.amin(x, reduce_dims)), (low, expected.min), (high, expected.max)]
        for ours, theirs in pairs:
            torch.testing.assert_close(ours, theirs, equal_nan=True, atol=0, rtol=0, msg=str((shape, dim)))


@pytest.mark.parametrize("device", DEVICES)
def test_int32_overflow_widens(device):
    x = torch.full((3000,), 2**30, dtype=torch.int32, device=device)
    x[::2] += torch.arange(1500, dtype=torch.int32, device=device)
    check_exact(fr.sum(x), torch.sum(x))
    assert fr.sum(x).item() > 2**31
    check_exact(fr.sum(x, dtype=torch.int32), torch.sum(x, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_argument(device):
    x = random_tensor((7, 9), torch.float16, device)
    check_sum_like(fr.sum(x, 1, dtype=torch.float32), x, lambda t: torch.sum(t, 1, dtype=torch.float32)
                   if t.dtype != torch.float64 else torch.sum(t, 1))
    ints = random_tensor((7, 9), torch.int16, device)
    check_exact(fr.sum(ints, dtype=torch.float64), torch.sum(ints, dtype=torch.float64))
    torch.testing.assert_close(fr.mean(ints, 0, dtype=torch.float64), torch.mean(ints, 0, dtype=torch.float64))
    check_exact(fr.prod(ints[:, :2], 1, dtype=torch.int64), torch.prod(ints[:, :2], 1, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_like_torch(device):
    x = random_tensor((3, 4), torch.float32, device)
    for ours, theirs in [
        (lambda: fr.sum(x, 2), lambda: torch.sum(x, 2)),
        (lambda: fr.amax(x, -3), lambda: torch.amax(x, -3)),
        (lambda: fr.sum(x, [0, 0]), lambda: torch.sum(x, [0, 0])),
        (lambda: fr.mean(x.int()), lambda: torch.mean(x.int())),
        (lambda: fr.mean(x, dtype=torch.int64), lambda: torch.mean(x, dtype=torch.int64)),
    ]:
        with pytest.raises(Exception) as expected:
            theirs()
        with pytest.raises(type(expected.value)):
            ours()
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        fr.sum(x.to(torch.complex64))


# ---- torch.compile, opcheck, autograd


def op_samples(device):
    x = random_tensor((6, 33), torch.float32, device)
    ints = random_tensor((6, 33), torch.int32, device)
    ops = torch.ops.fastreduce
    return [
        (ops.sum.default, (x, [1], False), {"dtype": None}),
        (ops.sum.default, (ints, None, True), {"dtype": None}),
        (ops.sum.default, (x.t(), [0], False), {"dtype": torch.float64}),
        (ops.mean.default, (x, [0], True), {"dtype": None}),
        (ops.prod.default, (1 + 0.1 * x, None, False), {"dtype": None}),
        (ops.prod.default, (ints, [1], False), {"dtype": None}),
        (ops.amax.default, (x, [1], False), {}),
        (ops.amin.default, (x.t(), [], True), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in op_samples(device):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    def f(x):
        return fr.sum(x, 1) + fr.mean(x, 1) * fr.amax(x, 1) - fr.amin(x, [1]) + fr.prod(x[:, :3], 1)

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic)
    for rows in (8, 13):
        x = random_tensor((rows, 40), torch.float32, device)
        torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = torch.randn(4, 5, 3, dtype=torch.float64, device=device, requires_grad=True)
    for fn in [
        lambda t: fr.sum(t, [0, 2]),
        lambda t: fr.sum(t, 1, keepdim=True),
        lambda t: fr.mean(t),
        lambda t: fr.mean(t, -1),
        lambda t: fr.prod(t, [1]),
        lambda t: fr.prod(t),
        lambda t: fr.amax(t, 1),
        lambda t: fr.amin(t, [0, 2], keepdim=True),
    ]:
        assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_prod_gradient_with_zeros(device):
    x = torch.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 4.0], [1.0, 5.0, 6.0]], device=device, requires_grad=True)
    fr.prod(x, 1).sum().backward()
    y = x.detach().clone().requires_grad_()
    torch.prod(y, 1).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zeros", [0, 1, 2])
@pytest.mark.parametrize("dim", [None, 0])
@pytest.mark.parametrize("incoming", [1.5, float("inf"), float("nan")])
def test_prod_gradient_with_zeros_and_non_finite_incoming(device, zeros, dim, incoming):
    # NaN where torch's are: the product of all elements gives 0 wherever two
    # or more are zero, whatever the incoming gradient; over a dim, or with
    # fewer zeros, it multiplies (inf times 0 is NaN).
    x = torch.tensor([2.0, 3.0, -1.0, 4.0, 0.5], device=device)
    x[:zeros] = 0
    incoming_grad = torch.tensor(incoming, device=device)
    dims = None if dim is None else [dim]
    ours = torch.ops.fastreduce.prod_backward(incoming_grad, x, torch.ops.fastreduce.prod(x, dims), dims, False)
    leaf = x.clone().requires_grad_()
    theirs = torch.prod(leaf) if dim is None else torch.prod(leaf, dim)
    (expected,) = torch.autograd.grad(theirs, leaf, incoming_grad)
    torch.testing.assert_close(ours, expected, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inf_first", [False, True])
def test_prod_gradient_follows_the_given_result(device, inf_first):
    # Small factors underflow to 0 before or after meeting the -inf, so the
    # product is -inf or NaN by the order of the multiplications. Without
    # zeros the gradient is result / x, as torch's: torch's result in,
    # torch's gradient out, whatever product our own order would give.
    small = [1e-3] * 8
    values = [float("-inf")] + small if inf_first else small + [float("-inf")]
    x = torch.tensor(values, dtype=torch.float16, device=device)
    leaf = x.clone().requires_grad_()
    result = torch.prod(leaf)
    incoming_grad = torch.tensor(1.5, dtype=x.dtype, device=device)
    (expected,) = torch.autograd.grad(result, leaf, incoming_grad)
    ours = torch.ops.fastreduce.prod_backward(incoming_grad, x, result.detach(), None, False)
    torch.testing.assert_close(ours, expected, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [None, [1], [0, 2]])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_prod_gradient_where_the_product_underflows(device, dims, dtype):
    # Each product underflows to 0 with no zero in the tensor: torch's
    # gradient is result / x there, 0; ours is the product of the others, as
    # float64's (where nothing underflows) rounds to.
    torch.manual_seed(0)
    small = 1e-5 if dtype == torch.float16 else 1e-25
    x = torch.empty(3, 4, 5, dtype=torch.float64, device=device).uniform_(0.9, 1.1)
    if dims is None:
        x.view(-1)[[0, 7]] = small
    elif dims == [1]:
        x[:, [0, 2], :] = small
    else:
        x[0, :, 0] = x[2, :, 3] = small
    leaf = x.to(dtype).requires_grad_()
    result = fr.prod(leaf, dims)
    incoming = torch.randn(result.shape, dtype=torch.float64, device=device)
    (ours,) = torch.autograd.grad(result, leaf, incoming.to(dtype))
    exact = leaf.detach().double().requires_grad_()
    product = exact.prod() if dims is None else exact.prod(2).prod(0) if dims == [0, 2] else exact.prod(1)
    (expected,) = torch.autograd.grad(product, exact, incoming)
    assert (result == 0).all()
    assert (expected.to(dtype) != 0).any()
    # Relative only: the values are far below the default atol. float16's
    # products of the others are subnormal in part (a few bits).
    torch.testing.assert_close(ours, expected.to(dtype), atol=0, rtol=0.05 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_prod_backward_opcheck(device):
    # A transposed self (the fake gives a contiguous gradient), a zero, and a
    # row whose product underflows.
    x = torch.randn(7, 5, device=device).t()
    x[1, 2] = 0
    x[3] = 1e-25
    for dims in (None, [0], [1], [0, 1]):
        result = fr.prod(x, dims)
        args = (torch.randn_like(result), x, result, dims, False)
        torch.library.opcheck(torch.ops.fastreduce.prod_backward.default, args)
    # A 0-d self: the gradient is grad's values in a tensor of its own.
    scalar = torch.tensor(3.0, device=device)
    grad = torch.tensor(2.0, device=device)
    args = (grad, scalar, fr.prod(scalar), None, False)
    torch.library.opcheck(torch.ops.fastreduce.prod_backward.default, args)
    ours = torch.ops.fastreduce.prod_backward(*args)
    assert ours == grad and ours.untyped_storage().data_ptr() != grad.untyped_storage().data_ptr()


# ---- CUDA-only properties


@requires_cuda
@pytest.mark.cuda
def test_bitwise_deterministic():
    x = torch.randn(2**24 + 7, device="cuda")
    rows = torch.randn(64, 70001, device="cuda")
    first = (fr.sum(x), fr.sum(rows, 1), fr.sum(rows, 0))
    for _ in range(5):
        again = (fr.sum(x), fr.sum(rows, 1), fr.sum(rows, 0))
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@requires_cuda
@captures_graphs
@pytest.mark.cuda
def test_cuda_graph_capture():
    x = torch.randn(2**22 + 5, device="cuda")
    m = torch.randn(300, 5000, device="cuda")
    fr.sum(x), fr.sum(m, 0)  # warm-up outside capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        total = fr.sum(x)
        columns = fr.sum(m, 0)
    x.copy_(torch.randn_like(x))
    m.copy_(torch.randn_like(m))
    graph.replay()
    torch.cuda.synchronize()
    check_sum_like(total, x, torch.sum)
    check_sum_like(columns, m, lambda t: torch.sum(t, 0))


@requires_cuda
@pytest.mark.cuda
def test_non_default_stream():
    stream = torch.cuda.Stream()
    x = torch.randn(2**23 + 1, device="cuda")
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        total = fr.sum(x)
        rows = fr.amax(x[: 2**23].view(1024, -1), 1)
    torch.cuda.current_stream().wait_stream(stream)
    check_sum_like(total, x, torch.sum)
    check_exact(rows, torch.amax(x[: 2**23].view(1024, -1), 1))


@requires_cuda
@pytest.mark.cuda
def test_single_launch_reductions_on_concurrent_streams():
    """Each stream's launches share that stream's arrival counters: four streams
    at once, 20 launches each of a full sum and of few long rows (split rows),
    every result equal to the one-stream result."""
    inputs = [torch.randn(2**22 + 3 * k, device="cuda") for k in range(4)]
    reduce = [fr.sum, lambda x: fr.sum(x[: 100 * 40000].view(100, -1), 1)]
    expected = [[f(x) for f in reduce] for x in inputs]
    streams = [torch.cuda.Stream() for _ in inputs]
    results = [[] for _ in inputs]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for stream, x, out in zip(streams, inputs, results):
            with torch.cuda.stream(stream):
                out.append([f(x) for f in reduce])
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    for want, got in zip(expected, results):
        assert all(torch.equal(w, g) for outs in got for w, g in zip(want, outs))


@requires_cuda
@captures_graphs
@pytest.mark.cuda
def test_single_launch_graphs_replay_on_any_stream():
    """Two captured graphs, replayed at once on two streams beside eager
    launches: each captured launch has a counter of its own."""
    x = torch.randn(2**23 + 7, device="cuda")
    y = torch.randn(37, 2**16 + 1, device="cuda")
    want_x, want_y = fr.sum(x), fr.amax(y, 1)
    graphs, outs = [], []
    for f in (lambda: fr.sum(x), lambda: fr.amax(y, 1)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(f())
        graphs.append(graph)
    streams = [torch.cuda.Stream() for _ in range(3)]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    eager = []
    for _ in range(10):
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        with torch.cuda.stream(streams[2]):
            eager.append(fr.sum(x))
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(outs[0], want_x) and torch.equal(outs[1], want_y)
    assert all(torch.equal(e, want_x) for e in eager)


@requires_cuda
@captures_graphs
@pytest.mark.cuda
def test_single_launch_without_a_free_counter():
    """Past the pool of counters (each capture takes its own for good: here
    one per row of 256 split rows) a launch zeroes counters in its workspace
    first: same results, bitwise."""
    script = """
import torch, fastreduce_torch as fr
x = torch.randn(256, 2**15 + 1, device="cuda")
want = fr.sum(x, 1)
for _ in range(1100):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fr.sum(x, 1)
graph.replay()
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    fresh = fr.sum(x, 1)  # a new stream: no counters left for it either
torch.cuda.synchronize()
assert torch.equal(out, want) and torch.equal(fresh, want), (out, fresh, want)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
