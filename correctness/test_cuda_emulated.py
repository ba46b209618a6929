"""The CUDA kernels' logic, run on the CPU.

`glai_kernels/csrc/cuda/estimator_kernels.cu` is compiled as C++ against a small emulation of
the CUDA runtime and of wmma (`correctness/cuda_emulation/`): each block's threads are fibers
that run in rounds from one __syncthreads to the next, fragments hold whole tiles, and the wmma
calls' alignment rules are checked. The four products then run through the same C launcher the
binding calls, and are compared with the float64 oracle at the suite's tolerances.

This checks what compiling cannot: indexing, tiling, partial tiles, split-K and its reduction,
the half-type conversions and the wmma calls' arguments, the cp.async pipelines' ordering (the
emulated copies land as late as the hardware may deliver them, or at once), and TF32's
rounding against a CPU model of it. It does not check the hardware (memory model, real
fragment layouts, speed): the suite's `cuda` cases on a GPU do.

TF32's tolerance (`reference.tolerance`, float16's 2e-3): each operand rounded to 10 mantissa
bits, to nearest, is off by at most 2^-11 of itself, so each term a·b by at most
(2·2^-11 + 2^-22)·|a·b| ≈ 2^-10·|a·b|; summed over K terms that is 2^-10 ≈ 9.8e-4 of the
absolute-sum scale the suite measures errors on, for any K (the float accumulation adds
K·2^-24 at worst, far less in practice). Against |y| itself, with signs that cancel, the
rounding errors add like a random walk, about 2^-11·sqrt(K)·rms|a·b|: that is why TF32 can
look far worse than 2^-10 on a cancelling sum, and why the suite's scale is the absolute sum.
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
                ("paths", ctypes.c_int64), ("outputs", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("allow_tf32", ctypes.c_int)]


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
    lib.glai_emulation_set_async_copies.argtypes = [ctypes.c_int]
    return lib


def _problem(x, act, weight, dy, dtype, tf32: bool = False) -> Problem:
    b, i = x.shape
    o, _, p = weight.shape
    return Problem(x.data_ptr(), act.data_ptr(), weight.data_ptr(),
                   dy.data_ptr() if dy is not None else None, b, i, p, o, DTYPE_CODES[dtype],
                   int(tf32))


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
    def splits(b, i, p, o, product, sms=132, dtype=0):
        problem = Problem(None, None, None, None, b, i, p, o, dtype, 0)
        return kernels.glai_cuda_splits(ctypes.byref(problem), PRODUCTS[product], sms)

    assert splits(4096, 385, 128, 37, "dweight") == 1  # 6 x 770 output tiles: no split
    assert 2 <= splits(256, 385, 128, 37, "y") <= 256  # 4 output tiles, K = 49280
    assert splits(16, 1, 1, 37, "y") == 1  # K = 1: nothing to split
    # B <= 32, the chains' rule (glai_cuda_splits): min(4 blocks per SM over the column
    # tiles, chains of at least 4 k tiles of 32 (16 for float64))
    assert splits(16, 385, 128, 37, "y") == 385  # A1: 1,540 tiles, 4 a chain
    assert splits(16, 769, 256, 4, "y") == 528  # C2: 6,152 tiles, the 528 blocks 132 SMs hold
    assert splits(16, 1281, 320, 128, "y") == 264  # B1: 2 column tiles share the 528
    assert splits(16, 385, 128, 37, "y", sms=114) == 385  # A1 fits an H100 PCIe's 456 too
    assert splits(32, 385, 128, 37, "y", sms=80) == 320  # ... not a V100's 320
    assert splits(16, 385, 128, 37, "y", dtype=1) == 528  # float64: 3,080 tiles of 16
    assert splits(16, 385, 128, 37, "dx") == 37  # 7 column tiles; K = 4,736: 148 tiles, 4 a chain
    assert splits(16, 3, 5, 7, "y") == 1  # K = 15: one tile


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


# ---- issue 38: short chains at B <= 32, the cp.async pipelines, TF32 -----------------------

OUT_KEYS = {"y": "y", "dx": "x", "dact": "act", "dweight": "weight"}


def _inputs(batch, inputs, paths, outputs, dtype, seed):
    data = make_inputs(batch, inputs, paths, outputs, dtype=dtype, seed=seed, gates="soft")
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(seed + 1))
    return data.x, data.act, data.weight, dy.to(dtype)


def _products(lib, x, act, weight, dy, dtype, splits, tf32=False, products=tuple(PRODUCTS)):
    """The emulated kernels' products, shaped as the oracle's (dweight [O, I, P])."""
    batch, inputs = x.shape
    outputs, _, paths = weight.shape
    problem = _problem(x, act, weight, dy, dtype, tf32)
    shapes = {"y": (batch, outputs), "dx": (batch, inputs), "dact": (batch, paths),
              "dweight": (outputs, inputs, paths)}
    return {name: _run(lib, problem, name, splits(name) if callable(splits) else splits,
                       shapes[name], dtype) for name in products}


def _oracle(x, act, weight, dy):
    x64, act64, w64, dy64 = (t.double() for t in (x, act, weight, dy))
    expected = {"y": forward64(x64, act64, w64), **grads64(dy64, x64, act64, w64)._asdict()}
    scale = {"y": abs_forward64(x64, act64, w64), **abs_grads64(dy64, x64, act64, w64)._asdict()}
    return expected, scale


def _rule(lib, x, weight, sms=132):
    """glai_cuda_splits for each product, as the binding asks it."""
    batch, inputs = x.shape
    outputs, _, paths = weight.shape

    def splits(product):
        problem = Problem(None, None, None, None, batch, inputs, paths, outputs,
                          DTYPE_CODES[x.dtype], 0)
        return lib.glai_cuda_splits(ctypes.byref(problem), PRODUCTS[product], sms)
    return splits


# (I, P, O) at B <= 32: P = 7 leaves the weight's rows in no 16-byte runs (plain loads),
# P = 16 in runs for every dtype (16-byte cp.async); y's N = O = 67 and dx's N = I crosses the
# 64-wide column tile where it can, K = I*P = 91 or 144 leaves a partial 32-wide k tile, and
# dx's K = O*P and dact's K = O*I run over several tiles of the 3-stage ring.
CHAIN_SHAPES = [(13, 7, 67), (5, 16, 70)]
CHAIN_KINDS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("batch", [1, 5, 16, 32])
@pytest.mark.parametrize("shape", CHAIN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", CHAIN_KINDS, ids=lambda d: str(d).removeprefix("torch."))
def test_short_chains_match_oracle(kernels, dtype, shape, batch):
    """B <= 32: y, dx and dact (the chain kernel's products; dweight, K = B, is the other
    kernels'), with the split count the rule gives (132 SMs) and with 2."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = _inputs(batch, *shape, dtype, seed=batch + sum(shape))
    expected, scale = _oracle(x, act, weight, dy)
    for splits in (_rule(kernels, x, weight), 2):
        got = _products(kernels, x, act, weight, dy, dtype, splits, products=("y", "dx", "dact"))
        for name, value in got.items():
            error = worst_error(value, expected[OUT_KEYS[name]], scale[OUT_KEYS[name]])
            assert error <= tolerance(dtype), f"{name} ({splits}): error {error:.3g}"


@pytest.mark.parametrize("deferred", [0, 1], ids=["copies-at-once", "copies-at-wait"])
def test_pipelines_either_way_copies_land(kernels, deferred):
    """The pipelines are right whether a cp.async lands when issued or only at its wait: the
    chain kernel (B = 16) and the bfloat16 tensor cores (B = 70), weight in 16-byte runs."""
    kernels.glai_emulation_set_compute_capability(80)
    kernels.glai_emulation_set_async_copies(deferred)
    try:
        for batch, dtype in ((16, torch.float32), (70, torch.bfloat16)):
            x, act, weight, dy = _inputs(batch, 5, 16, 70, dtype, seed=batch)
            expected, scale = _oracle(x, act, weight, dy)
            got = _products(kernels, x, act, weight, dy, dtype, 3)
            for name, value in got.items():
                error = worst_error(value, expected[OUT_KEYS[name]], scale[OUT_KEYS[name]])
                assert error <= tolerance(dtype), f"{dtype} {name}: error {error:.3g}"
    finally:
        kernels.glai_emulation_set_async_copies(1)


def test_misaligned_weight_takes_plain_loads(kernels):
    """A weight that starts 4 bytes past a 16-byte boundary (a view) has no 16-byte runs even
    when P allows them; the kernels must load it element by element (an emulated cp.async
    from it fails the launch as a misaligned address)."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = _inputs(16, 5, 16, 70, torch.float32, seed=3)
    storage = torch.empty(weight.numel() + 1)
    shifted = storage[1:].view(weight.shape)
    shifted.copy_(weight)
    assert shifted.data_ptr() % 16 != 0
    expected, scale = _oracle(x, act, weight, dy)
    got = _products(kernels, x, act, shifted, dy, torch.float32, 2, products=("y", "dx", "dact"))
    for name, value in got.items():
        error = worst_error(value, expected[OUT_KEYS[name]], scale[OUT_KEYS[name]])
        assert error <= tolerance(torch.float32), f"{name}: error {error:.3g}"


def test_chains_reduce_in_split_order(kernels):
    """Deterministic: y at B = 16 with I = 5, P = 64 and 5 splits gives each split one i (two
    32-wide k tiles), so the result is bit for bit the float32 sum, in split order, of the five
    one-input problems y(x[:, i], w[:, i, :]), each one chain of its own; asking for 6 splits
    gives the same 5 chains (no empty split), and a second run the same bits."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = _inputs(16, 5, 64, 67, torch.float32, seed=11)
    ys = [_products(kernels, x, act, weight, dy, torch.float32, n, products=("y",))["y"]
          for n in (5, 5, 6)]
    total = torch.zeros(16, 67)
    for i in range(5):
        part = _products(kernels, x[:, i:i + 1].contiguous(), act,
                         weight[:, i:i + 1].contiguous(), dy, torch.float32, 1,
                         products=("y",))["y"]
        total = total + part
    for y in ys:
        assert torch.equal(y, total)
    one_chain = _products(kernels, x, act, weight, dy, torch.float32, 1, products=("y",))["y"]
    assert not torch.equal(one_chain, total)  # another order: the test can tell orders apart


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 (10 mantissa bits) to nearest, ties away from zero, as
    cvt.rna.tf32.f32 (__float_to_tf32) does; finite values only."""
    bits = t.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bits = (bits + 0x1000) & 0xFFFFE000
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits)
    return bits.to(torch.int32).view(torch.float32)


def _tf32_model(x, act, weight, dy):
    """The four products as TF32 tensor cores compute them: each GEMM operand formed in
    float32 (x·act, dy·act, dy·x), rounded to TF32, the products summed exactly (float64)."""
    xa = _tf32(x[:, :, None] * act[:, None, :]).double()  # [B, I, P]
    da = _tf32(dy[:, :, None] * act[:, None, :]).double()  # [B, O, P]
    dx_ = _tf32(dy[:, :, None] * x[:, None, :]).double()  # [B, O, I]
    w = _tf32(weight).double()
    return {"y": torch.einsum("bis,ois->bo", xa, w),
            "x": torch.einsum("bos,ois->bi", da, w),
            "act": torch.einsum("boi,ois->bs", dx_, w),
            "weight": torch.einsum("bo,bis->ois", _tf32(dy).double(), xa)}


@pytest.mark.parametrize("shape", [(70, 6, 11, 67), (40, 3, 16, 5)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tf32_matches_a_cpu_model_of_tf32(kernels, shape):
    """float32 with TF32 allowed, B > 32 (the tensor-core tile, 16-wide k tiles; P = 16 in
    16-byte runs, P = 11 not): within float32's tolerance of the CPU model of TF32, within
    TF32's of the oracle, for one split and three."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = _inputs(*shape, torch.float32, seed=sum(shape))
    expected, scale = _oracle(x, act, weight, dy)
    model = _tf32_model(x, act, weight, dy)
    for splits in (1, 3):
        got = _products(kernels, x, act, weight, dy, torch.float32, splits, tf32=True)
        for name, value in got.items():
            key = OUT_KEYS[name]
            to_model = worst_error(value, model[key], scale[key])
            assert to_model <= tolerance(torch.float32), f"{name}: {to_model:.3g} off the model"
            error = worst_error(value, expected[key], scale[key])
            assert error <= tolerance(torch.float32, tf32=True), f"{name}: error {error:.3g}"


def test_tf32_rounds_where_allowed_and_only_there(kernels):
    """Known wrong for float32, by design: w = 1 + 2^-11 lies exactly halfway between two
    TF32 values, and x = act = dy = 1. TF32 rounds it away from zero to 1 + 2^-10 (not to
    even, which would give 1, nor by truncation), so each term is off by 2^-11 of itself:
    y = K·(1 + 2^-10) exactly, an error of 4.9e-4 of the scale, over float32's tolerance and
    within TF32's. Without TF32 allowed, at B <= 32 (the chains) and below sm_80, full float32
    gives K·(1 + 2^-11) exactly."""
    batch, inputs, paths, outputs = 40, 3, 5, 7
    k = inputs * paths
    ones = torch.ones
    x, act, dy = ones(batch, inputs), ones(batch, paths), ones(batch, outputs)
    weight = torch.full((outputs, inputs, paths), 1 + 2.0 ** -11)
    expected, scale = _oracle(x, act, weight, dy)
    kernels.glai_emulation_set_compute_capability(80)
    y = _products(kernels, x, act, weight, dy, torch.float32, 1, tf32=True, products=("y",))["y"]
    assert torch.equal(y, torch.full_like(y, k * (1 + 2.0 ** -10)))
    error = worst_error(y, expected["y"], scale["y"])
    assert tolerance(torch.float32) < error <= tolerance(torch.float32, tf32=True)
    exact = torch.full((batch, outputs), k * (1 + 2.0 ** -11))
    cases = [(80, batch, False), (80, 16, True), (60, batch, True)]  # (arch, B, TF32 allowed)
    for arch, b, allowed in cases:
        kernels.glai_emulation_set_compute_capability(arch)
        y = _products(kernels, x[:b], act[:b], weight, dy[:b], torch.float32, 1, tf32=allowed,
                      products=("y",))["y"]
        assert torch.equal(y, exact[:b]), (arch, b, allowed)
