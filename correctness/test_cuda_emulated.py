"""The CUDA kernels' logic, run on the CPU.

`glai_kernels/csrc/cuda/estimator_kernels.cu` is compiled as C++ against a small emulation of
the CUDA runtime and of wmma (`correctness/cuda_emulation/`): each block's threads are fibers
that run in rounds from one __syncthreads to the next, fragments hold whole tiles, and the wmma
calls' alignment rules are checked. The four products then run through the same C launcher the
binding calls, and are compared with the float64 oracle at the suite's tolerances.

This checks what compiling cannot: indexing, tiling, partial tiles, split-K and its reduction,
the half-type conversions and the wmma calls' arguments. It does not check the hardware (memory
model, real fragment layouts, speed): the suite's `cuda` cases on a GPU do.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from emulated_build import build_emulated

from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "glai_kernels" / "csrc" / "cuda" / "estimator_kernels.cu"

# the kernels' dtype codes (estimator_kernels.cu), not a list of dtypes
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
PRODUCTS = {"y": 0, "dx": 1, "dact": 2, "dweight": 3}
INVALID_VALUE = 1  # cudaErrorInvalidValue


class Problem(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("act", ctypes.c_void_p), ("weight", ctypes.c_void_p),
                ("dy", ctypes.c_void_p), ("batch", ctypes.c_int64), ("inputs", ctypes.c_int64),
                ("paths", ctypes.c_int64), ("outputs", ctypes.c_int64), ("dtype", ctypes.c_int)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    lib = build_emulated(SOURCE, tmp_path_factory.mktemp("cuda_emulation"), "glai_cuda_emulated")
    lib.glai_cuda_splits.restype = ctypes.c_int
    lib.glai_cuda_splits.argtypes = [ctypes.POINTER(Problem), ctypes.c_int, ctypes.c_int]
    lib.glai_cuda_workspace_elements.restype = ctypes.c_int64
    lib.glai_cuda_workspace_elements.argtypes = [ctypes.POINTER(Problem), ctypes.c_int,
                                                 ctypes.c_int]
    lib.glai_cuda_launch.restype = ctypes.c_int
    lib.glai_cuda_launch.argtypes = [ctypes.POINTER(Problem), ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.glai_emulation_set_compute_capability.argtypes = [ctypes.c_int]
    return lib


def _problem(x, act, weight, dy, dtype) -> Problem:
    b, i = x.shape
    o, _, p = weight.shape
    return Problem(x.data_ptr(), act.data_ptr(), weight.data_ptr(),
                   dy.data_ptr() if dy is not None else None, b, i, p, o, DTYPE_CODES[dtype])


def _run(lib, problem: Problem, product: str, splits: int, shape, dtype) -> torch.Tensor:
    out = torch.full(shape, float("nan"), dtype=dtype)
    count = lib.glai_cuda_workspace_elements(ctypes.byref(problem), PRODUCTS[product], splits)
    workspace = torch.full((max(count, 1),), float("nan"),
                           dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    status = lib.glai_cuda_launch(ctypes.byref(problem), PRODUCTS[product], splits,
                                  out.data_ptr(), workspace.data_ptr() if count else None, None)
    assert status == 0, f"launch returned cudaError {status}"
    return out


# (B, I, P, O): one partial tile; two row tiles (B > 64) with P not a multiple of the k tile;
# two column tiles of y and two row tiles of dweight (O > 64); a long reduction (I*P = 360).
SHAPES = [(5, 3, 7, 2), (70, 6, 11, 3), (9, 13, 5, 67), (4, 40, 9, 3)]
# (dtype, compute capability): half types on tensor cores (8.0) and on CUDA cores (6.0)
KINDS = [(torch.float32, 80), (torch.float64, 80), (torch.float16, 80), (torch.bfloat16, 80),
         (torch.float16, 60), (torch.bfloat16, 60)]


@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "split-k"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("dtype", "arch"), KINDS,
                         ids=[f"{str(d).removeprefix('torch.')}-sm{a}" for d, a in KINDS])
def test_products_match_oracle(kernels, dtype, arch, shape, splits):
    kernels.glai_emulation_set_compute_capability(arch)
    data = make_inputs(*shape, dtype=dtype, seed=sum(shape), gates="soft")
    batch, inputs, paths, outputs = shape
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(1)).to(dtype)
    problem = _problem(data.x, data.act, data.weight, dy, dtype)
    x64, act64, w64, dy64 = (t.double() for t in (data.x, data.act, data.weight, dy))
    expected = {"y": forward64(x64, act64, w64), **grads64(dy64, x64, act64, w64)._asdict()}
    scale = {"y": abs_forward64(x64, act64, w64), **abs_grads64(dy64, x64, act64, w64)._asdict()}
    out_shapes = {"y": (batch, outputs), "dx": (batch, inputs), "dact": (batch, paths),
                  "dweight": (outputs, inputs * paths)}
    for product, key in (("y", "y"), ("dx", "x"), ("dact", "act"), ("dweight", "weight")):
        got = _run(kernels, problem, product, splits, out_shapes[product], dtype)
        got = got.view(expected[key].shape)
        error = worst_error(got, expected[key], scale[key])
        assert error <= tolerance(dtype), f"{product}: error {error:.3g}"


def test_split_count(kernels):
    def splits(b, i, p, o, product, sms=132):
        problem = Problem(None, None, None, None, b, i, p, o, 0)
        return kernels.glai_cuda_splits(ctypes.byref(problem), PRODUCTS[product], sms)

    assert splits(4096, 385, 128, 37, "dweight") == 1  # 6 x 770 output tiles: no split
    small_output = splits(16, 385, 128, 37, "y")  # one output tile, K = 49280
    assert 2 <= small_output <= 256
    assert splits(16, 1, 1, 37, "y") == 1  # K = 1: nothing to split


def test_sizes_beyond_the_grid_are_refused(kernels):
    # 64 * 65536 rows need 65536 row tiles, one more than gridDim.y allows
    problem = Problem(None, None, None, None, 64 * 65536, 1, 1, 1, 0)
    out = torch.empty(1)
    assert kernels.glai_cuda_launch(ctypes.byref(problem), PRODUCTS["y"], 1, out.data_ptr(),
                                    None, None) == INVALID_VALUE


@pytest.mark.parametrize("arch", [60, 80], ids=["sm60", "sm80"])
def test_float16_products_past_the_half_range(kernels, arch):
    """x·act = 320 * 320 = 102400 > 65504, float16's largest; y = 400 and dweight = 6400
    exactly. A formed operand rounded to float16 (as wmma takes it) would be inf."""
    kernels.glai_emulation_set_compute_capability(arch)
    h = torch.float16
    x, act = torch.full((1, 1), 320.0, dtype=h), torch.full((1, 1), 320.0, dtype=h)
    weight, dy = torch.full((1, 1, 1), 2.0 ** -8, dtype=h), torch.full((1, 1), 2.0 ** -4, dtype=h)
    problem = _problem(x, act, weight, dy, h)
    assert _run(kernels, problem, "y", 1, (1, 1), h).item() == 400.0
    assert _run(kernels, problem, "dweight", 1, (1, 1), h).item() == 6400.0
