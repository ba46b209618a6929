"""float16 on tensor cores (issue 38), run on the CPU through the CUDA emulation.

From sm_80, float16's y, dx and dact at B > 32 run on wmma m16n16k16 with float accumulators.
wmma takes the formed operand (x·act, dy·act, dy·x) rounded to float16, which overflows past
65504 (and loses its bits below 2^-14) where the float32-accumulated result the contract asks
for need not; so each row of it is scaled by a power of two chosen from the row's bound and
unscaled exactly in the epilogue (estimator_kernels.cu's header comment; docs/notes/cuda.md,
"float16 on tensor cores (issue 38, stop 46)"). dweight (its formed operand is wmma's B) stays
on CUDA cores, as does everything below sm_80 and at B <= 32 (the chains).

Each check runs twice: on the kernels as built, and on a copy built with
GLAI_PLANT_FP16_UNSCALED (every row's scale 1, i.e. the formed operand rounded as it is), which
must fail exactly where the tensor cores run and pass where they do not.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from cuda_emulated_kernels import SOURCE, load, oracle, products

from reference import make_inputs, tolerance
from reference.tolerance import worst_error

H = torch.float16


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    return load(tmp_path_factory.mktemp("fp16_tc"), name="glai_fp16_tc")


@pytest.fixture(scope="module")
def unscaled(tmp_path_factory) -> ctypes.CDLL:
    """The kernels with the planted bug: no row scaling."""
    work = tmp_path_factory.mktemp("fp16_tc_planted")
    wrapper = work / "planted.cu"
    wrapper.write_text(f'#define GLAI_PLANT_FP16_UNSCALED 1\n#include "{SOURCE}"\n')
    return load(work, wrapper, "glai_fp16_tc_planted")


@pytest.fixture(autouse=True)
def _defaults(kernels, unscaled):
    """sm_80 and copies landing at their wait, for each test and after it."""
    for lib in (kernels, unscaled):
        lib.glai_emulation_set_compute_capability(80)
        lib.glai_emulation_set_async_copies(1)
    yield
    for lib in (kernels, unscaled):
        lib.glai_emulation_set_compute_capability(80)
        lib.glai_emulation_set_async_copies(1)


def _inputs(batch, inputs, paths, outputs, seed, row_exponents=(0,), weight_exponent=0):
    """Seeded x, act, weight, dy in float16; row b of x, act and dy times 2^e, e cycling over
    row_exponents (so a row's formed products move by 2^(2e)), the weight times
    2^weight_exponent."""
    data = make_inputs(batch, inputs, paths, outputs, dtype=torch.float32, seed=seed,
                       gates="soft")
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(seed + 1))
    rows = torch.tensor([2.0 ** row_exponents[b % len(row_exponents)] for b in range(batch)])
    x, act, dy = (t * rows[:, None] for t in (data.x, data.act, dy))
    weight = data.weight * 2.0 ** weight_exponent
    return tuple(t.to(H).contiguous() for t in (x, act, weight, dy))


def _errors(got, x, act, weight, dy):
    expected, scale = oracle(x, act, weight, dy)
    return {name: worst_error(value, expected[name], scale[name])
            for name, value in got.items()}


# (B, I, P, O), B > 32: two row tiles with a partial one (B = 70) and N = O = 67 crossing the
# 64-wide column tile; P = 16 (the weight in 16-byte runs: cp.async) against P = 11 and 5;
# K = I*P = 66, 48 and 65 leave a partial 32-wide k tile; dx's K = O*P = 1,072 runs the ring.
SHAPES = [(70, 6, 11, 67), (40, 3, 16, 67), (33, 13, 5, 3)]


@pytest.mark.parametrize("deferred", [0, 1], ids=["copies-at-once", "copies-at-wait"])
@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "split-k"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tensor_cores_match_oracle(kernels, shape, splits, deferred):
    """All four products (dweight on CUDA cores) within float16's tolerance, either way the
    copies land, with and without split-K."""
    kernels.glai_emulation_set_async_copies(deferred)
    x, act, weight, dy = _inputs(*shape, seed=sum(shape))
    errors = _errors(products(kernels, x, act, weight, dy, splits), x, act, weight, dy)
    assert max(errors.values()) <= tolerance(H), errors


# Rows whose formed products leave float16's normal range: 2^16 times larger (up to ~2^17.6,
# past 65504; the weight 2^-10 keeps the outputs finite), or 2^-20 times smaller (~2^-21,
# float16's subnormals, where a value keeps 3 to 7 bits; the weight 2^6 keeps the outputs
# normal). Unscaled, those rows overflow or lose their low bits; scaled, they do not.
RANGES = {"huge-rows": ((0, 8), -10), "tiny-rows": ((0, -10), 6)}


@pytest.mark.parametrize("case", RANGES)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_rows_outside_the_half_range(kernels, unscaled, shape, case):
    """y, dx, dact within float16's tolerance of the oracle; the planted copy is not."""
    rows, weight_exponent = RANGES[case]
    x, act, weight, dy = _inputs(*shape, seed=sum(shape), row_exponents=rows,
                                 weight_exponent=weight_exponent)
    names = ("y", "dx", "dact")
    errors = _errors(products(kernels, x, act, weight, dy, 1, names), x, act, weight, dy)
    assert max(errors.values()) <= tolerance(H), errors
    planted = _errors(products(unscaled, x, act, weight, dy, 1, names), x, act, weight, dy)
    assert all(planted[name] > tolerance(H) for name in names), planted


def _overflow_case(batch):
    """x = act = dy = 320: every formed product is 320 * 320 = 102400 > 65504; with
    w = 2^-8, I = P = O = 1, y = dx = dact = 400 exactly; dweight = batch * 2^-14 * 102400
    with dy = 2^-14 (another call)."""
    full = torch.full
    return (full((batch, 1), 320.0, dtype=H), full((batch, 1), 320.0, dtype=H),
            full((1, 1, 1), 2.0 ** -8, dtype=H), full((batch, 1), 320.0, dtype=H))


def test_products_past_the_half_range_are_exact(kernels, unscaled):
    """B = 40 at sm_80: y, dx, dact = 400 exactly on the tensor cores; the planted copy rounds
    the formed 102400 to inf."""
    x, act, weight, dy = _overflow_case(40)
    got = products(kernels, x, act, weight, dy, 1, ("y", "dx", "dact"))
    for name, value in got.items():
        assert torch.equal(value, torch.full_like(value, 400.0)), name
    planted = products(unscaled, x, act, weight, dy, 1, ("y", "dx", "dact"))
    for name, value in planted.items():
        assert not torch.isfinite(value).any(), name


@pytest.mark.parametrize(("arch", "batch"), [(60, 40), (75, 40), (80, 16)],
                         ids=["sm60", "sm75", "sm80-chains"])
def test_cuda_cores_where_the_tensor_cores_do_not_run(kernels, unscaled, arch, batch):
    """Below sm_80, and at B <= 32 (the chains), float16 stays on CUDA cores (float): even the
    planted copy, which has no scaling, gives 400 exactly."""
    x, act, weight, dy = _overflow_case(batch)
    for lib in (kernels, unscaled):
        lib.glai_emulation_set_compute_capability(arch)
        got = products(lib, x, act, weight, dy, 1, ("y", "dx", "dact"))
        for name, value in got.items():
            assert torch.equal(value, torch.full_like(value, 400.0)), (name, arch, batch)


def test_dweight_stays_on_cuda_cores(kernels, unscaled):
    """dweight at B = 40, sm_80: its formed operand (x·act = 102400) is wmma's B, which no row
    scale can undo after the sum, so it runs on CUDA cores: 40 * 2^-14 * 102400 = 250 exactly,
    on the planted copy too (on the tensor cores that would be inf)."""
    x, act, weight, _ = _overflow_case(40)
    dy = torch.full((40, 1), 2.0 ** -14, dtype=H)
    expected = 40 * 2.0 ** -14 * 102400
    for lib in (kernels, unscaled):
        got = products(lib, x, act, weight, dy, 1, ("dweight",))["dweight"]
        assert torch.equal(got, torch.full_like(got, expected))
