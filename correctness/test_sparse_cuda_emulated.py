"""The sparse CUDA kernels' logic, run on the CPU.

`glai_kernels/csrc/cuda/sparse_kernels.cu` is compiled as C++ against the CUDA emulation of
`correctness/cuda_emulation/` (a block's threads are fibers run in rounds between barriers;
see test_cuda_emulated.py) and its four passes (forward with and without the kept group sums,
dvalues, dx, dact) run through the C launchers the binding calls. Each is compared with the
float64 passes over the layout (`glai_kernels/sparse/reference.py`) at the dense suite's
tolerance for its dtype, on the absolute-sum scale, at awkward sizes: batches that are not a
multiple of the lanes' tile (and span two tiles), K = 0 and K = 1, an output with no kept
path, and groups, inputs and paths with more entries than a block has rows.

What this checks: indexing of the layout, the batch tiles and the rows' strides, the fixed
order reductions and their barriers, the transposed operands, the half types' conversions.
What it cannot: the hardware (memory model, speed); the `cuda` cases of test_sparse.py do.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import sparse_nonfinite as nonfinite
import torch
from emulated_build import build_emulated
from sparse_cuda_abi import DTYPES, INVALID_VALUE, SparseProblem, ptr

from glai_kernels.sparse import KeptIndex, from_dense
from glai_kernels.sparse.reference import backward64, forward64, group_sums64
from reference import make_inputs, tolerance
from reference.tolerance import worst_error

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "glai_kernels" / "csrc" / "cuda" / "sparse_kernels.cu"



@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    lib = build_emulated(SOURCE, tmp_path_factory.mktemp("sparse_cuda_emulation"),
                         "glai_sparse_cuda_emulated")
    problem = ctypes.POINTER(SparseProblem)
    signatures = {
        "glai_sparse_forward": [problem, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
        "glai_sparse_dvalues": [problem, ctypes.c_void_p, ctypes.c_void_p],
        "glai_sparse_dx": [problem, ctypes.c_void_p, ctypes.c_void_p],
        "glai_sparse_dact": [problem, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
    }
    for name, argtypes in signatures.items():
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = argtypes
    return lib


class Call:
    """One problem's tensors, kept alive while the C side holds their pointers."""

    def __init__(self, x, act, values, index: KeptIndex, dy=None):
        self.xt, self.actt = x.t().contiguous(), act.t().contiguous()
        self.values, self.index = values.contiguous(), index
        self.dyt = dy.t().contiguous() if dy is not None else None
        batch, inputs = x.shape
        outputs, _, paths = index.shape
        self.acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        self.struct = SparseProblem(
            ptr(self.xt), ptr(self.actt), ptr(self.values), ptr(self.dyt),
            *(ptr(t) for t in index), batch, inputs, paths, outputs, index.nnz, index.groups,
            DTYPES[x.dtype])

    def ref(self):
        return ctypes.byref(self.struct)


def _nan(shape, dtype) -> torch.Tensor:
    """An output buffer whose every element must be written."""
    return torch.full(shape, float("nan"), dtype=dtype)


def _kept(shape: tuple[int, int, int], keep: int, seed: int, empty_output: bool,
          long_group: bool) -> torch.Tensor:
    outputs, inputs, paths = shape
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(outputs * inputs * paths, dtype=torch.bool)
    mask[torch.randperm(mask.numel(), generator=gen)[:keep]] = True
    mask = mask.view(shape)
    if long_group:  # output 0, path 0: every input, a group longer than any block's rows
        mask[0, :, 0] = True
    if empty_output:
        mask[outputs // 2] = False
    return mask


# (B, I, P, O), kept entries, an output with no kept path, one group over every input.
# Lanes: 8 for B <= 8, 16 for B <= 16, else 32 (two tiles at B = 37); rows = 256 / lanes,
# or 1024 / lanes in a per-item pass (forward, dx, dact) with fewer than 512 blocks.
CASES = {
    "K0-B5": ((5, 6, 4, 3), 0, False, False),
    "K1-B3": ((3, 5, 4, 6), 1, False, False),
    # B = 2, not 1: a dvalue at B = 1 is one product of three normals, which can fall below
    # float16's normal range, where no kernel could meet the tolerance's relative scale
    "B2": ((2, 9, 5, 4), 60, False, False),
    "B13-empty-output": ((13, 8, 7, 5), 100, True, False),
    "B37-two-tiles": ((37, 7, 6, 4), 60, True, False),
    "B16-long-group": ((16, 300, 3, 2), 200, False, True),
    "B9-many-groups": ((9, 5, 70, 2), 500, False, False),
    # 512 or more blocks: the per-item passes run 256-thread blocks, not the wide 1024 ones
    "O520-forward-narrow": ((3, 4, 3, 520), 1500, True, False),
    "I600-dx-narrow": ((37, 600, 3, 2), 3000, False, False),
    "P600-dact-narrow": ((5, 3, 600, 2), 1500, False, False),
}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_passes_match_reference(kernels, case, dtype):
    (batch, inputs, paths, outputs), keep, empty_output, long_group = case
    seed = batch + inputs + paths + outputs
    # Soft gates, except in float16 (binary there, as test_sparse.py's float16 cases): a sum
    # of one or two products of three normals can fall below float16's normal range, where
    # even the oracle rounded to float16 misses the relative tolerance.
    gates = "binary" if dtype == torch.float16 else "soft"
    data = make_inputs(batch, inputs, paths, outputs, dtype=dtype, seed=seed, gates=gates)
    mask = _kept((outputs, inputs, paths), keep, seed, empty_output, long_group)
    # values O(1), for the same reason: make_inputs scales the weight by 1/sqrt(I*P) so that
    # dense sums of I*P terms stay O(1), and a sparse sum has few terms
    weight = (data.weight.double() * (inputs * paths) ** 0.5).to(dtype)
    sw = from_dense(weight, mask)
    values, index = sw.values.detach(), sw.index
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(seed),
                     dtype=torch.float64).to(dtype)
    call = Call(data.x, data.act, values, index, dy)
    x, act = data.x, data.act
    tol = tolerance(dtype)

    def check(name, got, expected, scale):
        assert got.dtype in (dtype, call.acc), name
        error = worst_error(got, expected, scale)
        assert error <= tol, f"{name}: error {error:.3g} (tolerance {tol:.3g})"

    abs_args = (x.abs(), act.abs(), values.abs())
    y, zgt = _nan((batch, outputs), dtype), _nan((index.groups, batch), call.acc)
    assert kernels.glai_sparse_forward(call.ref(), y.data_ptr(), zgt.data_ptr(), None) == 0
    check("y", y, forward64(x, act, values, index), forward64(*abs_args, index))
    check("Zg", zgt.t(), group_sums64(x, values, index), group_sums64(x.abs(), values.abs(),
                                                                       index))
    # y alone, and Zg alone: the same bits as together (each is one fixed-order sum)
    y_only, zg_only = _nan((batch, outputs), dtype), _nan((index.groups, batch), call.acc)
    assert kernels.glai_sparse_forward(call.ref(), y_only.data_ptr(), None, None) == 0
    assert kernels.glai_sparse_forward(call.ref(), None, zg_only.data_ptr(), None) == 0
    assert torch.equal(y_only, y) and torch.equal(zg_only, zgt)

    expected = backward64(dy, x, act, values, index)
    scale = backward64(dy.abs(), *abs_args, index)
    dx, dact, dv = _nan((batch, inputs), dtype), _nan((batch, paths), dtype), _nan(
        (index.nnz,), dtype)
    assert kernels.glai_sparse_dx(call.ref(), dx.data_ptr(), None) == 0
    assert kernels.glai_sparse_dact(call.ref(), zgt.data_ptr(), dact.data_ptr(), None) == 0
    assert kernels.glai_sparse_dvalues(call.ref(), dv.data_ptr(), None) == 0
    check("dx", dx, expected[0], scale[0])
    check("dact", dact, expected[1], scale[1])
    check("dvalues", dv, expected[2], scale[2])


def test_dvalues_over_many_blocks(kernels):
    """2000 entries at B = 16: 64 entries a block (16 rows x 4), 32 blocks, the last partial."""
    batch, inputs, paths, outputs = 16, 40, 10, 6
    data = make_inputs(batch, inputs, paths, outputs, seed=7, gates="soft")
    mask = _kept((outputs, inputs, paths), 2000, 7, False, False)
    sw = from_dense(data.weight, mask)
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(8))
    call = Call(data.x, data.act, sw.values.detach(), sw.index, dy)
    dv = _nan((sw.nnz,), torch.float32)
    assert kernels.glai_sparse_dvalues(call.ref(), dv.data_ptr(), None) == 0
    args = (data.x, data.act, sw.values.detach(), sw.index)
    expected = backward64(dy, *args)[2]
    scale = backward64(dy.abs(), *(t.abs() for t in args[:3]), sw.index)[2]
    assert worst_error(dv, expected, scale) <= tolerance(torch.float32)


def test_bad_launches_are_refused(kernels):
    problem = SparseProblem()
    problem.batch, problem.inputs_count, problem.outputs, problem.nnz = 4, 3, 1, 2
    out = torch.empty(4)
    # a null output with elements to write, and gradients without dy
    assert kernels.glai_sparse_dx(ctypes.byref(problem), None, None) == INVALID_VALUE
    assert kernels.glai_sparse_dvalues(ctypes.byref(problem), out.data_ptr(),
                                       None) == INVALID_VALUE
    assert kernels.glai_sparse_dx(ctypes.byref(problem), out.data_ptr(), None) == INVALID_VALUE
    # 32 * 65536 rows need 65536 batch tiles, one more than gridDim.y allows
    problem.batch = 32 * 65536
    assert kernels.glai_sparse_forward(ctypes.byref(problem), out.data_ptr(), None,
                                       None) == INVALID_VALUE
    # a forward asked for nothing does nothing
    assert kernels.glai_sparse_forward(ctypes.byref(problem), None, None, None) == 0


# ---- NaN and Inf (issue 40, item 5) ----------------------------------------------------------
# As test_sparse_contract.py's check of the other sparse backends (the cases and the oracle:
# sparse_nonfinite.py): each element of y, dx, dact and dvalues is NaN, +inf, -inf or finite
# as the float64 sum over the kept entries, term by term or grouped as the layout states the op
# (they may differ where an infinite act or dy multiplies a group's sum); the finite ones
# within the dtype's tolerance. The batches take one tile of lanes (B = 5) and two, the second
# partial (B = 37), so padded lanes are exercised.


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("batch", [5, 37], ids=["B5", "B37"])
def test_nan_and_inf_propagate_as_the_float64_sums(kernels, batch, dtype):
    infinite = {"y": False, "dact": False}
    for seed in range(6):
        x, act, sw, dy = nonfinite.nonfinite_case(seed, batch, dtype)
        values, index = sw.values.detach(), sw.index
        terms, grouped, scale = nonfinite.oracles64(x, act, values, index, dy)
        call = Call(x, act, values, index, dy)
        y, zgt = _nan((batch, index.shape[0]), dtype), _nan((index.groups, batch), call.acc)
        dx, dact = _nan(x.shape, dtype), _nan(act.shape, dtype)
        dv = _nan((index.nnz,), dtype)
        assert kernels.glai_sparse_forward(call.ref(), y.data_ptr(), zgt.data_ptr(), None) == 0
        assert kernels.glai_sparse_dx(call.ref(), dx.data_ptr(), None) == 0
        assert kernels.glai_sparse_dact(call.ref(), zgt.data_ptr(), dact.data_ptr(), None) == 0
        assert kernels.glai_sparse_dvalues(call.ref(), dv.data_ptr(), None) == 0
        got = {"y": y, "dx": dx, "dact": dact, "dvalues": dv}
        for (name, actual), term, group, size in zip(got.items(), terms, grouped, scale,
                                                     strict=True):
            # float16 (no gates' floor here, unlike the fuzzer): a sum of a few products of
            # normals can fall below its normal range, where the relative tolerance means
            # nothing; its classes are checked, not its finite values
            reached = nonfinite.assert_as_the_sums(f"{name} (seed {seed})", actual, term,
                                                   group, size, dtype,
                                                   finite_values=dtype != torch.float16)
            if name in infinite:
                infinite[name] |= reached
    assert all(infinite.values())  # the planted values reached ±inf in y and dact


def test_an_infinite_value_in_a_short_group_stays_inf(kernels):
    """test_sparse_contract.py's case of the padded rounds: one kept entry per group, an
    infinite value, B = 29 (one partial tile of 32 lanes); y and dact are ±inf, never NaN."""
    x, act, sw, dy = nonfinite.short_group_case()
    call = Call(x, act, sw.values.detach(), sw.index, dy)
    y, zgt = _nan((29, 3), torch.float32), _nan((sw.index.groups, 29), torch.float32)
    dact = _nan((29, 3), torch.float32)
    assert kernels.glai_sparse_forward(call.ref(), y.data_ptr(), zgt.data_ptr(), None) == 0
    assert kernels.glai_sparse_dact(call.ref(), zgt.data_ptr(), dact.data_ptr(), None) == 0
    nonfinite.assert_short_group_classes("the emulated kernels", y, dact, x, act, sw, dy)
