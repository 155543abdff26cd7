"""var/std/var_mean/std_mean, logsumexp, norm, argmax/argmin, aminmax, any/all,
foreach_norm and clip_grad_norm_ against float64 references and torch."""

import math
import warnings

import pytest
import torch

import fastreduce_torch as fr
from conftest import DEVICES, captures_graphs, offset_view, random_tensor, requires_cuda

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
# (shape, dim) cases reaching each layout: full, rows (short and long), columns (unpacked,
# narrow tiles, full tiles), middle dims.
CASES = [
    ((1,), None), ((31,), None), ((2**20 + 3,), None), ((33, 1025), 1), ((7, 31), -1), ((3, 70000), 1),
    ((1025, 33), 0), ((4100, 8), 0), ((600, 1024), 0), ((5, 6, 7), (0, 2)), ((5, 6, 7), 1), ((64, 3, 9), (1, 2)),
]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def layouts(x):
    """The input as it is, transposed (then transposed back to the same values),
    and at an unaligned storage offset."""
    yield x
    if x.dim() >= 2:
        yield x.transpose(0, 1).contiguous().transpose(0, 1)
    yield offset_view(x, 1)


def close(ours, reference, dtype, scale=None, theirs=None):
    """ours (in dtype) against a float64 reference, relative to |reference| or
    `scale`, or within twice torch's own error (`theirs`, torch's result)."""
    scale = reference.abs() if scale is None else scale
    error = (ours.double() - reference).abs()
    bound = TOLERANCE[dtype] * (scale + 1e-30) + 1e-300
    if theirs is not None:
        bound = torch.maximum(bound, 2 * (theirs.double() - reference).abs())
    assert ours.shape == reference.shape
    both_nan = ours.double().isnan() & reference.isnan()
    same_inf = ours.double() == reference.to(dtype).double()  # overflow to inf in the output dtype too
    assert bool(((error <= bound) | both_nan | same_inf).all()), f"max error {error.max()}"


# ---- var, std, var_mean, std_mean


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("shape,dim", CASES, ids=str)
def test_moments(device, dtype, shape, dim):
    # A large mean: the sum-of-squares formula would cancel.
    base = (random_tensor(shape, torch.float64, device) + 1000).to(dtype)
    for x in layouts(base):
        reference = x.double()
        for correction in [None, 0, 2.5]:
            c = 1 if correction is None else correction
            expected_var = torch.var(reference, dim, correction=c)
            expected_mean = torch.mean(reference, dim)
            torch_var = torch.var(x, dim, correction=c)
            ours = fr.var(x, dim, correction=correction)
            assert ours.dtype == dtype
            close(ours, expected_var, dtype, theirs=torch_var)
            close(fr.std(x, dim, correction=correction), expected_var.sqrt(), dtype,
                  theirs=torch.std(x, dim, correction=c))
            spread, mean = fr.var_mean(x, dim, correction=correction, keepdim=True)
            close(spread, torch.var(reference, dim, correction=c, keepdim=True), dtype,
                  theirs=torch_var.reshape(spread.shape))
            close(mean, torch.mean(reference, dim, keepdim=True), dtype)
            spread, mean = fr.std_mean(x, dim, correction=correction)
            close(spread, expected_var.sqrt(), dtype, theirs=torch.std(x, dim, correction=c))
            close(mean, expected_mean, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("length", [1025, 4099, 16387, 40000])
def test_moments_of_many_long_rows(device, dtype, length):
    # Rows enough to fill any GPU unsplit (a whole block a row, 64-512
    # threads by length), far from zero.
    x = (random_tensor((1100, length), torch.float64, device) * 3 + 100).to(dtype)
    reference = x.double()
    for correction in [0, 1]:
        var, mean = fr.var_mean(x, 1, correction=correction)
        close(var, torch.var(reference, 1, correction=correction), dtype)
        close(mean, reference.mean(1), dtype)
        close(fr.std(x, 1, correction=correction), torch.std(reference, 1, correction=correction), dtype)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype,shape", [(torch.bfloat16, (26000, 2050)), (torch.float16, (13000, 4100)),
                                         (torch.float32, (13000, 2052)), (torch.bfloat16, (1100, 40000)),
                                         (torch.bfloat16, (40000, 1001)), (torch.float32, (60000, 1000))], ids=str)
def test_costly_folds_of_many_rows(dtype, shape):
    # The folds that take more vectors a thread (reduce_plan.cuh's kRowVecs,
    # kTeamVecs): long and short rows in teams of 4, 8 and 16 lanes on a GPU
    # of 132 SMs, and in blocks, far from zero, with ties, and at an
    # unaligned offset (a head and a tail folded element by element).
    base = (random_tensor(shape, torch.float64, "cuda") * 3 + 100).to(dtype)
    ties = random_tensor(shape, torch.int64, "cuda", low=-3, high=3).to(dtype)
    for x, tied in ((base, ties), (offset_view(base, 1), offset_view(ties, 3))):
        reference = x.double()
        var, mean = fr.var_mean(x, 1)
        close(var, torch.var(reference, 1), dtype)
        close(mean, reference.mean(1), dtype)
        expected = torch.logsumexp(reference, 1)
        close(fr.logsumexp(x, 1), expected, dtype, scale=expected.abs() + 1)
        assert torch.equal(fr.argmax(tied, 1), torch.argmax(tied, 1))
        assert torch.equal(fr.argmin(tied, 1), torch.argmin(tied, 1))
        assert torch.equal(fr.argmax(x, 1), torch.argmax(x, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_moments_edge_cases(device):
    empty = torch.empty(0, 3, device=device)
    assert fr.var(empty).isnan().all() and fr.var(empty, 0).shape == (3,) and fr.var(empty, 0).isnan().all()
    spread, mean = fr.var_mean(empty, 0)
    assert spread.isnan().all() and mean.isnan().all()
    one = torch.tensor([2.0], device=device)
    assert fr.var(one).isnan() and fr.var(one, correction=0) == 0
    two = torch.tensor([1.0, 3.0], device=device)
    assert fr.var(two, correction=3) == torch.var(two.cpu(), correction=3).item() == math.inf
    assert fr.var(torch.tensor([1.0, math.nan], device=device)).isnan()
    assert fr.std(torch.tensor(3.0, device=device), correction=0) == 0
    with pytest.raises(RuntimeError, match="floating"):
        fr.var(torch.ones(3, dtype=torch.int32, device=device))
    with pytest.raises(IndexError):
        fr.var(two, 3)
    with pytest.raises(RuntimeError, match="multiple times"):
        fr.var(torch.ones(2, 2, device=device), (0, 0))


def test_moments_warn_at_every_call_without_degrees_of_freedom():
    # As torch.var: a Python warning at each such call (the filters decide what shows), none otherwise.
    x = torch.randn(3, 2)
    with warnings.catch_warnings(record=True) as valid:
        warnings.simplefilter("always")
        fr.var(x, 1, correction=1.5)
        fr.std_mean(x, 0)
    with warnings.catch_warnings(record=True) as invalid:
        warnings.simplefilter("always")
        fr.var(x, 1, correction=2)
        fr.std(x, 1, correction=3)
        fr.var_mean(torch.empty(0))
    assert not [w for w in valid if "degrees of freedom" in str(w.message)]
    assert sum("degrees of freedom is <= 0" in str(w.message) for w in invalid) == 3


# ---- logsumexp


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,dim", [c for c in CASES if c[1] is not None], ids=str)
def test_logsumexp(device, dtype, shape, dim):
    base = (4 * random_tensor(shape, torch.float64, device)).to(dtype)
    for x in layouts(base):
        reference = torch.logsumexp(x.double(), dim)
        ours = fr.logsumexp(x, dim)
        assert ours.dtype == dtype
        close(ours, reference, dtype, scale=reference.abs() + 1)
    close(fr.logsumexp(base, dim, keepdim=True), torch.logsumexp(base.double(), dim, keepdim=True), dtype,
          scale=torch.logsumexp(base.double(), dim, keepdim=True).abs() + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_logsumexp_special_values(device):
    inf, nan = math.inf, math.nan
    rows = torch.tensor([[-inf, -inf, -inf], [inf, 1.0, 2.0], [inf, inf, -inf], [nan, 1.0, -inf],
                         [-inf, -inf, nan], [1e30, 1e30, -1e30]], device=device)
    torch.testing.assert_close(fr.logsumexp(rows, 1), torch.logsumexp(rows, 1), equal_nan=True)
    assert fr.logsumexp(torch.empty(0, device=device), 0) == -inf
    integers = torch.arange(5, device=device)
    torch.testing.assert_close(fr.logsumexp(integers, 0), torch.logsumexp(integers, 0))
    # The same rows 40 wide, each special in the middle of a vector, over
    # rows and over columns (the CPU folds both in vectors).
    wide = torch.randn(6, 40, generator=torch.Generator().manual_seed(5)).to(device)
    wide[:, 13:16] = rows
    wide[0] = -inf
    for dim in (0, 1):
        torch.testing.assert_close(fr.logsumexp(wide, dim), torch.logsumexp(wide, dim), equal_nan=True)
        torch.testing.assert_close(fr.logsumexp(wide.T.contiguous(), 1 - dim),
                                   torch.logsumexp(wide.T.contiguous(), 1 - dim), equal_nan=True)
    # Columns 70 rows tall, the specials in rows 20-25: the CPU folds columns
    # 16 rows at a time, so they arrive after a group of finite rows.
    tall = torch.randn(70, 40, generator=torch.Generator().manual_seed(6)).to(device)
    tall[20:26, 13:16] = rows
    tall[:, 0] = -inf
    tall[:, 1] = torch.where(torch.arange(70, device=device) == 40, inf, tall[:, 1])
    torch.testing.assert_close(fr.logsumexp(tall, 0), torch.logsumexp(tall, 0), equal_nan=True)


# ---- norm


ORDS = [2, 1, 0, 3, 0.5, -1, math.inf, -math.inf]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,dim", CASES, ids=str)
def test_norm(device, dtype, shape, dim):
    base = random_tensor(shape, dtype, device)
    for x in layouts(base):
        for ord in ORDS:
            reference = torch.linalg.vector_norm(x.double(), ord, dim)
            ours = fr.norm(x, ord, dim)
            assert ours.dtype == dtype
            if ord == 0:
                # counts: exact in float64, rounded once to the output dtype
                assert torch.equal(ours, reference.to(dtype))
            else:
                close(ours, reference, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_norm_dtype_overflow_and_errors(device):
    x = random_tensor((100, 33), torch.float16, device)
    ours = fr.norm(x, 2, 1, dtype=torch.float64)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, torch.linalg.vector_norm(x, 2, 1, dtype=torch.float64))
    big = torch.full((1000,), 1e20, dtype=torch.bfloat16, device=device)
    expected = torch.linalg.vector_norm(big.double())
    assert fr.norm(big).isfinite() and abs(fr.norm(big).double() - expected) / expected < 1e-2
    assert fr.norm(big, 3).isfinite()
    assert fr.norm(torch.empty(0, device=device)) == 0
    with pytest.raises(RuntimeError, match="identity"):
        fr.norm(torch.empty(0, device=device), math.inf)
    with pytest.raises(RuntimeError, match="floating"):
        fr.norm(torch.ones(3, dtype=torch.int64, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,dim", [((2**16 + 3,), None), ((33, 1025), 1), ((1025, 33), 0), ((4100, 8), 0)], ids=str)
def test_two_norm_of_half_types_at_every_scale(device, dtype, shape, dim):
    # Runs of 29 elements at scales 2^-130 ... 2^120 (as far as the dtype
    # reaches): squares that overflow or underflow float beside ones that do
    # not, 2^60 and 2^-40 exactly, zeros, an infinity and a NaN.
    x = random_tensor(shape, torch.float64, device)
    info = torch.finfo(dtype)
    run = torch.arange(x.numel(), device=device).view(shape) // 29
    exponent = (run % 27 - 13) * 10.0
    x = (x * torch.exp2(exponent)).clamp(-info.max, info.max)
    x = torch.where(run % 31 == 5, torch.exp2(torch.tensor(60.0, device=device)), x)
    x = torch.where(run % 37 == 6, torch.exp2(torch.tensor(-40.0, device=device)), x)
    x = torch.where(run % 41 == 7, 0.0, x).to(dtype)
    flat = x.view(-1)
    flat[100] = math.inf
    flat[-50] = math.nan
    # Inputs near the dtype's smallest normal (squares far below float's
    # range for bfloat16) and zeros.
    tiny = (random_tensor(shape, torch.float64, device) * info.tiny * 4).to(dtype)
    for view in [*layouts(x), tiny, torch.zeros_like(x)]:
        close(fr.norm(view, 2, dim), torch.linalg.vector_norm(view.double(), 2, dim), dtype)


@pytest.mark.parametrize("ord", [math.inf, -math.inf, -1.0])
def test_norm_fake_of_empty_inputs(ord):
    # inf and negative orders of an empty input: over a non-empty dim the
    # operator returns an empty result, over an empty one it raises; its fake
    # kernel (torch.compile) must do the same (torch 2.11's meta raises in both).
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.empty(64, 2, 0)
    real = torch.ops.fastreduce.norm(x, ord, [-3], True)
    assert real.shape == torch.linalg.vector_norm(x, ord, -3, True).shape
    with FakeTensorMode() as mode:
        fake = torch.ops.fastreduce.norm(mode.from_tensor(x), ord, [-3], True)
    assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
    with pytest.raises(RuntimeError, match="identity"):
        torch.ops.fastreduce.norm(x, ord, [-1])
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="identity"):
        torch.ops.fastreduce.norm(mode.from_tensor(x), ord, [-1])


# ---- argmax, argmin, aminmax


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS, ids=str)
@pytest.mark.parametrize("shape,dim", [c for c in CASES if c[1] is None or isinstance(c[1], int)], ids=str)
def test_argmax_argmin(device, dtype, shape, dim):
    # Few distinct values: many ties, where the first index must win.
    base = random_tensor(shape, torch.int64, device, low=-3, high=3).to(dtype)
    for x in layouts(base):
        for keepdim in [False, True]:
            assert torch.equal(fr.argmax(x, dim, keepdim), torch.argmax(x, dim, keepdim))
            assert torch.equal(fr.argmin(x, dim, keepdim), torch.argmin(x, dim, keepdim))
    transposed = base.t() if base.dim() == 2 else base
    assert torch.equal(fr.argmax(transposed), torch.argmax(transposed))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool], ids=str)
@pytest.mark.parametrize("shape,dim", [c for c in CASES if c[1] is None or isinstance(c[1], int)], ids=str)
def test_aminmax(device, dtype, shape, dim):
    base = random_tensor(shape, dtype, device)
    for x in layouts(base):
        low, high = fr.aminmax(x, dim=dim, keepdim=dim is not None)
        expected = torch.aminmax(x, dim=dim, keepdim=dim is not None)
        assert torch.equal(low, expected.min) and torch.equal(high, expected.max)


@pytest.mark.parametrize("device", DEVICES)
def test_selection_special_values(device):
    nan = math.nan
    x = torch.tensor([[1.0, nan, 3.0, nan], [2.0, 2.0, -1.0, -1.0], [-math.inf, -math.inf, 0, 0]], device=device)
    assert torch.equal(fr.argmax(x, 1), torch.argmax(x, 1))
    assert torch.equal(fr.argmin(x, 1), torch.argmin(x, 1))
    assert torch.equal(fr.argmax(x), torch.argmax(x))
    low, high = fr.aminmax(x, dim=1)
    torch.testing.assert_close(low, torch.aminmax(x, dim=1).min, equal_nan=True)
    torch.testing.assert_close(high, torch.aminmax(x, dim=1).max, equal_nan=True)
    with pytest.raises(RuntimeError, match="bool"):
        fr.argmax(torch.ones(3, dtype=torch.bool, device=device))
    with pytest.raises(RuntimeError, match="numel"):
        fr.argmax(torch.empty(0, device=device))
    with pytest.raises(IndexError, match="non-zero size"):
        fr.argmin(torch.empty(2, 0, device=device), 1)
    assert fr.argmax(torch.empty(0, 3, device=device), 1).shape == (0,)
    with pytest.raises((RuntimeError, IndexError), match="empty"):
        fr.aminmax(torch.empty(0, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int16, torch.int64], ids=str)
def test_argmax_argmin_within_runs(device, dtype):
    # Consecutive elements are folded a run at a time (its extreme first, then
    # the first index holding it): the winner, a later tie, NaNs and an
    # all -inf row at every position of the first runs, the runs shifted by
    # storage offsets.
    generator = torch.Generator().manual_seed(3)
    floating = dtype.is_floating_point
    for position in range(40):
        base = torch.randint(-50, 50, (4, 1031), generator=generator).to(dtype)
        base[0, position] = base[0, position + 17] = 100
        base[1, position] = base[1, position + 5] = -100
        if floating:
            base[2, position] = base[2, position + 9] = math.nan
            base[3] = -math.inf
            base[3, position + 3] = math.inf
        for x in (base.to(device), offset_view(base.to(device), 1), offset_view(base.to(device), 3)):
            assert torch.equal(fr.argmax(x, 1), torch.argmax(x, 1)), position
            assert torch.equal(fr.argmin(x, 1), torch.argmin(x, 1)), position
            assert torch.equal(fr.argmax(x), torch.argmax(x)), position
            assert torch.equal(fr.argmin(x[1:]), torch.argmin(x[1:])), position
    # Rows of several CPU blocks (4096 elements): the winner and its ties in
    # different blocks.
    for position in (0, 4095, 4096, 8191, 9000):
        row = torch.randint(-50, 50, (3, 12293), generator=generator).to(dtype)
        row[0, position] = row[0, (position + 4096) % 12293] = 100
        row[1, position] = -100
        if floating:
            row[2, position] = row[2, 12000] = math.nan
        x = row.to(device)
        assert torch.equal(fr.argmax(x, 1), torch.argmax(x, 1)), position
        assert torch.equal(fr.argmin(x, 1), torch.argmin(x, 1)), position


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64], ids=str)
@pytest.mark.parametrize("rows,columns", [(70, 8), (1025, 33), (3000, 768), (20000, 64)], ids=str)
def test_argmax_argmin_down_columns(device, dtype, rows, columns):
    # A column's rows fold in order on the GPU, each lane's first through the
    # full tie rule, the rest as later ones: winners, later ties and NaNs at
    # the first rows of lanes and anywhere else; columns of one value, the
    # extremes of the type included (-inf for argmax, the lowest integer).
    generator = torch.Generator().manual_seed(rows + columns)
    floating = dtype.is_floating_point
    info = torch.finfo(dtype) if floating else torch.iinfo(dtype)
    lowest, highest = (-math.inf, math.inf) if floating else (info.min, info.max)
    base = torch.randint(-50, 50, (rows, columns), generator=generator).to(dtype)
    winners = torch.randint(0, rows, (columns,), generator=generator)
    winners[: min(columns, 6)] = torch.tensor([0, 1, 2, 31, 64, rows - 1])[: min(columns, 6)].clamp(max=rows - 1)
    for c in range(columns):
        w = int(winners[c])
        kind = c % 6
        if kind == 0:
            base[w, c] = 100
            base[min(w + 1 + c % 7, rows - 1), c] = 100
        elif kind == 1:
            base[w, c] = -100
        elif kind == 2:
            base[:, c] = lowest
        elif kind == 3:
            base[:, c] = highest
            base[w, c] = lowest
        elif kind == 4:
            base[:, c] = 7
        elif floating:
            base[w, c] = base[min(w + 3, rows - 1), c] = math.nan
    for x in (base.to(device), offset_view(base.to(device), 1), base.to(device).view(rows, 1, columns)):
        assert torch.equal(fr.argmax(x, 0), torch.argmax(x, 0))
        assert torch.equal(fr.argmin(x, 0), torch.argmin(x, 0))
    tall = base.to(device).view(rows, columns, 1).expand(rows, columns, 2).contiguous()
    assert torch.equal(fr.argmax(tall, 0), torch.argmax(tall, 0))
    assert torch.equal(fr.argmin(tall, 1), torch.argmin(tall, 1))


# ---- any, all


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool], ids=str)
@pytest.mark.parametrize("shape,dim", CASES, ids=str)
def test_any_all(device, dtype, shape, dim):
    # Mostly zeros with a sprinkle of non-zeros: rows of every outcome.
    sparse = (torch.rand(shape, device=device) < 0.002).to(dtype)
    dense = (torch.rand(shape, device=device) < 0.998).to(dtype)
    for base in [sparse, dense]:
        for x in layouts(base):
            for keepdim in [False, True]:
                expected_any = torch.any(x, dim, keepdim) if dim is not None else torch.any(x)
                expected_all = torch.all(x, dim, keepdim) if dim is not None else torch.all(x)
                if dim is None and keepdim:
                    continue
                assert torch.equal(fr.any(x, dim, keepdim), expected_any)
                assert torch.equal(fr.all(x, dim, keepdim), expected_all)


@pytest.mark.parametrize("device", DEVICES)
def test_any_all_special_values(device):
    x = torch.tensor([[0.0, -0.0], [math.nan, 0.0], [0.0, 1e-40]], device=device)
    assert torch.equal(fr.any(x, 1), torch.any(x, 1)) and torch.equal(fr.all(x, 1), torch.all(x, 1))
    assert fr.any(torch.empty(0, device=device)) == torch.tensor(False, device=device)
    assert fr.all(torch.empty(0, device=device)) == torch.tensor(True, device=device)
    u8 = torch.tensor([0, 2], dtype=torch.uint8, device=device)
    assert fr.any(u8).dtype == torch.uint8 == torch.any(u8).dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8], ids=str)
def test_any_all_of_every_byte(device, dtype):
    # Bytes of every value (0x80 and 0xff among them), rows long enough to be
    # read in 16-byte packs: every other row of the dense input has one zero,
    # of the sparse one a single non-zero.
    g = torch.Generator().manual_seed(0)
    rows, width = 64, 4099
    where = (torch.arange(0, rows, 2), torch.randint(0, width, (rows // 2,), generator=g))
    dense = torch.randint(1, 256, (rows, width), generator=g, dtype=torch.int32)
    dense[where] = 0
    sparse = torch.zeros(rows, width, dtype=torch.int32)
    sparse[where] = torch.randint(1, 256, (rows // 2,), generator=g, dtype=torch.int32)
    for base in [dense, sparse]:
        for x in layouts(base.to(torch.uint8).view(dtype).to(device)):
            for dim in [None, 0, 1]:
                expected_any = torch.any(x, dim) if dim is not None else torch.any(x)
                expected_all = torch.all(x, dim) if dim is not None else torch.all(x)
                assert torch.equal(fr.any(x, dim), expected_any)
                assert torch.equal(fr.all(x, dim), expected_all)


# ---- autograd, through every argument combination


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_gradients(device, dim, keepdim):
    x = (random_tensor((3, 4, 5), torch.float64, device) + 2).requires_grad_()
    checks = [
        lambda t: fr.var(t, dim, keepdim=keepdim),
        lambda t: fr.std(t, dim, correction=0, keepdim=keepdim),
        lambda t: fr.var_mean(t, dim, correction=2, keepdim=keepdim),
        lambda t: fr.std_mean(t, dim, keepdim=keepdim),
        lambda t: fr.var_mean(t, dim, keepdim=keepdim)[1],
        lambda t: fr.logsumexp(t, dim if dim is not None else (0, 1, 2), keepdim),
    ]
    checks += [lambda t, o=o: fr.norm(t, o, dim, keepdim) for o in [2, 1, 3, 0.5, -1, math.inf, -math.inf]]
    if not isinstance(dim, tuple):
        checks.append(lambda t: fr.aminmax(t, dim=dim, keepdim=keepdim))
    for f in checks:
        assert torch.autograd.gradcheck(f, (x,))
    # Against torch's own formulas (std where the spread is 0, norm ties).
    flat = torch.tensor([[1.0, 1.0, 1.0], [1.0, -3.0, 3.0]], device=device, dtype=torch.float64)
    for ours, theirs in [(lambda t: fr.std(t, 1), lambda t: torch.std(t, 1)),
                         (lambda t: fr.norm(t, math.inf, 1), lambda t: torch.linalg.vector_norm(t, math.inf, 1))]:
        a, b = flat.clone().requires_grad_(), flat.clone().requires_grad_()
        ours(a).sum().backward()
        theirs(b).sum().backward()
        torch.testing.assert_close(a.grad, b.grad)
    counted = flat.clone().requires_grad_()
    fr.norm(counted, 0, 1).sum().backward()  # a count: zero gradient (torch gives none)
    assert torch.equal(counted.grad, torch.zeros_like(flat))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gradients_low_precision(device, dtype):
    x = random_tensor((16, 40), dtype, device).requires_grad_()
    for ours, theirs in [(fr.var, torch.var), (fr.std, torch.std),
                         (lambda t: fr.norm(t, 2, 1), lambda t: torch.linalg.vector_norm(t, 2, 1)),
                         (lambda t: fr.logsumexp(t, 1), lambda t: torch.logsumexp(t, 1))]:
        a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        ours(a).sum().backward()
        theirs(b).sum().backward()
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-2, atol=2e-2)


# ---- autocast: logsumexp in float32, norm with dtype=float32 on CUDA


@requires_cuda
@pytest.mark.cuda
def test_autocast_cuda():
    x = torch.randn(8, 64, device="cuda", dtype=torch.float16)
    with torch.autocast("cuda", dtype=torch.float16):
        for ours, theirs in [(lambda t: fr.logsumexp(t, 1), lambda t: torch.logsumexp(t, 1)),
                             (lambda t: fr.norm(t, 2, 1), lambda t: torch.linalg.vector_norm(t, 2, 1)),
                             (lambda t: fr.var(t, 1), lambda t: torch.var(t, 1)),
                             (lambda t: fr.aminmax(t).max, lambda t: torch.aminmax(t).max)]:
            assert ours(x).dtype == theirs(x).dtype


# ---- foreach_norm and clip_grad_norm_


def parameter_shapes():
    return [(768,), (50304, 8), (31,), (1,), (3, 1025), (2**17 + 5,), (0,), (4, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", [2, 1, math.inf, 0, 3])
def test_foreach_norm(device, ord):
    tensors = [random_tensor(s, dtype, device)
               for s in parameter_shapes() for dtype in [torch.float32, torch.bfloat16, torch.float64]]
    if ord == math.inf:
        tensors = [t for t in tensors if t.numel()]
    ours = fr.foreach_norm(tensors, ord)
    for t, n in zip(tensors, ours):
        expected = torch.linalg.vector_norm(t.double(), ord)
        assert n.dtype == t.dtype and n.shape == ()
        bound = 1e-12 if t.dtype == torch.float64 else 1e-5 if t.dtype == torch.float32 else 1e-2
        assert abs(n.double() - expected) <= bound * expected + 1e-30
    many = [random_tensor((i % 7 + 1, 100), torch.float32, device) for i in range(300)]  # several tables
    for t, n in zip(many, fr.foreach_norm(many)):
        torch.testing.assert_close(n, torch.linalg.vector_norm(t))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", [3, 0.5, -1, 2, 0, -math.inf])
def test_foreach_norm_of_one_element(device, ord):
    # |x| for any order, as torch's, where a power of x would overflow or underflow float32.
    tensors = [torch.tensor(v, device=device).to(dtype).reshape(shape)
               for v in [5.7e29, -7.1e-31, 3.0, 0.0, -math.inf, math.nan]
               for dtype in [torch.float32, torch.bfloat16] for shape in [(1,), ()]]
    for ours, theirs in zip(fr.foreach_norm(tensors, ord), torch._foreach_norm(tensors, ord)):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_foreach_norms_share_no_storage(device):
    # A custom operator's outputs may not alias one another (torch.compile
    # raises from torch 2.12): each norm, and each fake one, has its own.
    from torch._subclasses.fake_tensor import FakeTensorMode

    shapes_and_dtypes = [(s, dtype) for s in [(5, 7), (33,), (0,)]
                         for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.float64]]
    tensors = [random_tensor(s, dtype, device) for s, dtype in shapes_and_dtypes]
    real = fr.foreach_norm(tensors)
    with FakeTensorMode():  # fake CUDA tensors need no GPU: the batched path's fakes everywhere
        fake_tensors = [torch.empty(s, dtype=dtype, device="cuda") for s, dtype in shapes_and_dtypes]
        fake = torch.ops.fastreduce.foreach_norm(fake_tensors)
    for inputs, norms in ((tensors, real), (fake_tensors, fake)):
        assert len({n.untyped_storage()._cdata for n in norms}) == len(inputs)
        assert [(n.shape, n.dtype, n.device) for n in norms] == [((), t.dtype, t.device) for t in inputs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm(device, norm_type, max_norm):
    def model_grads():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(33, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 5))
        model.to(device)
        model(torch.randn(16, 33, device=device)).square().sum().backward()
        return model

    ours, theirs = model_grads(), model_grads()
    total = fr.clip_grad_norm_(ours.parameters(), max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm, norm_type)
    torch.testing.assert_close(total, expected)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    bad = torch.nn.Linear(2, 2).to(device)
    bad(torch.tensor([[math.inf, 1.0]], device=device)).sum().backward()
    with pytest.raises(RuntimeError, match="non-finite"):
        fr.clip_grad_norm_(bad.parameters(), 1.0, error_if_nonfinite=True)


# ---- opcheck, torch.compile, CUDA graphs, determinism


def op_samples(device):
    x = random_tensor((6, 33), torch.float32, device).requires_grad_()
    ops = torch.ops.fastreduce
    return [
        (ops.var.default, (x,), {"dim": [1], "correction": 0, "keepdim": True}),
        (ops.std.default, (x, None), {}),
        (ops.var_mean.default, (x, [0]), {}),
        (ops.std_mean.default, (x, [1]), {"correction": 2}),
        (ops.logsumexp.default, (x, [1]), {}),
        (ops.norm.default, (x, 3, [1]), {}),
        (ops.norm.default, (x,), {"dtype": torch.float64}),
        (ops.argmax.default, (x, 1, True), {}),
        (ops.argmin.default, (x,), {}),
        (ops.aminmax.default, (x,), {"dim": 0}),
        (ops.any.default, (x > 1, [1]), {}),
        (ops.all.default, (x > -3,), {}),
        (ops.foreach_norm.default, ([x.detach(), x.detach()[0]], 2), {}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for op, args, kwargs in op_samples(device):
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    def f(x):
        spread, mean = fr.var_mean(x, 1)
        total = fr.std(x) + fr.logsumexp(x, 1).sum() + fr.norm(x, 2, 0).sum() + spread.sum() + mean.sum()
        low, high = fr.aminmax(x, dim=1)
        picked = fr.argmax(x, 1).float().sum() + fr.any(x > 0, 1).float().sum()
        norms = torch.stack(fr.foreach_norm([x.detach(), x.detach()[0]])).sum()  # outputs of their own
        return total + (high - low).sum() + picked + norms

    compiled = torch.compile(f, fullgraph=True)
    x = random_tensor((8, 40), torch.float32, device).requires_grad_()
    y = x.detach().clone().requires_grad_()
    torch.testing.assert_close(compiled(x), f(y))
    compiled(x).backward()
    f(y).backward()
    torch.testing.assert_close(x.grad, y.grad)


@requires_cuda
@captures_graphs
@pytest.mark.cuda
def test_cuda_graph_capture_and_determinism():
    x = torch.randn(4096, 1000, device="cuda") + 50
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fr.var(x, 0)  # warm up outside capture
        fr.logsumexp(x, 1)
        fr.foreach_norm([x, x[0]])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outputs = [fr.var(x, 0), fr.logsumexp(x, 1), fr.norm(x), fr.argmax(x), *fr.foreach_norm([x, x[0]])]
    graph.replay()
    torch.cuda.synchronize()
    eager = [fr.var(x, 0), fr.logsumexp(x, 1), fr.norm(x), fr.argmax(x), *fr.foreach_norm([x, x[0]])]
    for captured, again in zip(outputs, eager):
        assert torch.equal(captured, again)  # bitwise: fixed partitioning, no atomics
