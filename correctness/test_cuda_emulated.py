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

import pytest
import torch
from cuda_emulated_kernels import PRODUCTS, inputs, load, oracle, products, sizes_problem

from reference import make_inputs, tolerance
from reference.tolerance import worst_error

INVALID_VALUE = 1  # cudaErrorInvalidValue


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    return load(tmp_path_factory.mktemp("cuda_emulation"))


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
    dy = torch.randn(shape[0], shape[3], generator=torch.Generator().manual_seed(1)).to(dtype)
    expected, scale = oracle(data.x, data.act, data.weight, dy)
    for product, got in products(kernels, data.x, data.act, data.weight, dy, splits).items():
        error = worst_error(got, expected[product], scale[product])
        assert error <= tolerance(dtype), f"{product}: error {error:.3g}"


def test_split_count(kernels):
    def splits(b, i, p, o, product, sms=132, dtype=torch.float32):
        problem = sizes_problem(b, i, p, o, dtype)
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
    assert splits(16, 385, 128, 37, "y", dtype=torch.float64) == 528  # float64: 3,080 tiles of 16
    assert splits(16, 385, 128, 37, "dx") == 37  # 7 column tiles; K = 4,736: 148 tiles, 4 a chain
    assert splits(16, 3, 5, 7, "y") == 1  # K = 15: one tile


def test_sizes_beyond_the_grid_are_refused(kernels):
    # 64 * 65536 rows need 65536 row tiles, one more than gridDim.y allows
    problem = sizes_problem(64 * 65536, 1, 1, 1)
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
    got = products(kernels, x, act, weight, dy, 1, names=("y", "dweight"))
    assert got["y"].item() == 400.0
    assert got["dweight"].item() == 6400.0


# ---- issue 38: short chains at B <= 32, the cp.async pipelines, TF32 -----------------------

def _rule(lib, x, weight, sms=132):
    """glai_cuda_splits for each product, as the binding asks it."""
    batch, width = x.shape
    outputs, _, paths = weight.shape

    def splits(product):
        problem = sizes_problem(batch, width, paths, outputs, x.dtype)
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
    x, act, weight, dy = inputs(batch, *shape, dtype, seed=batch + sum(shape))
    expected, scale = oracle(x, act, weight, dy)
    for splits in (_rule(kernels, x, weight), 2):
        got = products(kernels, x, act, weight, dy, splits, names=("y", "dx", "dact"))
        for name, value in got.items():
            error = worst_error(value, expected[name], scale[name])
            assert error <= tolerance(dtype), f"{name} ({splits}): error {error:.3g}"


@pytest.mark.parametrize("deferred", [0, 1], ids=["copies-at-once", "copies-at-wait"])
def test_pipelines_either_way_copies_land(kernels, deferred):
    """The pipelines are right whether a cp.async lands when issued or only at its wait: the
    chain kernel (B = 16) and the bfloat16 tensor cores (B = 70), weight in 16-byte runs."""
    kernels.glai_emulation_set_compute_capability(80)
    kernels.glai_emulation_set_async_copies(deferred)
    try:
        for batch, dtype in ((16, torch.float32), (70, torch.bfloat16)):
            x, act, weight, dy = inputs(batch, 5, 16, 70, dtype, seed=batch)
            expected, scale = oracle(x, act, weight, dy)
            got = products(kernels, x, act, weight, dy, 3)
            for name, value in got.items():
                error = worst_error(value, expected[name], scale[name])
                assert error <= tolerance(dtype), f"{dtype} {name}: error {error:.3g}"
    finally:
        kernels.glai_emulation_set_async_copies(1)


def test_misaligned_weight_takes_plain_loads(kernels):
    """A weight that starts 4 bytes past a 16-byte boundary (a view) has no 16-byte runs even
    when P allows them; the kernels must load it element by element (an emulated cp.async
    from it fails the launch as a misaligned address)."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = inputs(16, 5, 16, 70, torch.float32, seed=3)
    storage = torch.empty(weight.numel() + 1)
    shifted = storage[1:].view(weight.shape)
    shifted.copy_(weight)
    assert shifted.data_ptr() % 16 != 0
    expected, scale = oracle(x, act, weight, dy)
    got = products(kernels, x, act, shifted, dy, 2, names=("y", "dx", "dact"))
    for name, value in got.items():
        error = worst_error(value, expected[name], scale[name])
        assert error <= tolerance(torch.float32), f"{name}: error {error:.3g}"


def test_chains_reduce_in_split_order(kernels):
    """Deterministic: y at B = 16 with I = 5, P = 64 and 5 splits gives each split one i (two
    32-wide k tiles), so the result is bit for bit the float32 sum, in split order, of the five
    one-input problems y(x[:, i], w[:, i, :]), each one chain of its own; asking for 6 splits
    gives the same 5 chains (no empty split), and a second run the same bits."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = inputs(16, 5, 64, 67, torch.float32, seed=11)
    ys = [products(kernels, x, act, weight, dy, n, names=("y",))["y"]
          for n in (5, 5, 6)]
    total = torch.zeros(16, 67)
    for i in range(5):
        part = products(kernels, x[:, i:i + 1].contiguous(), act,
                        weight[:, i:i + 1].contiguous(), dy, 1, names=("y",))["y"]
        total = total + part
    for y in ys:
        assert torch.equal(y, total)
    one_chain = products(kernels, x, act, weight, dy, 1, names=("y",))["y"]
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
            "dx": torch.einsum("bos,ois->bi", da, w),
            "dact": torch.einsum("boi,ois->bs", dx_, w),
            "dweight": torch.einsum("bo,bis->ois", _tf32(dy).double(), xa)}


@pytest.mark.parametrize("shape", [(70, 6, 11, 67), (40, 3, 16, 5)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tf32_matches_a_cpu_model_of_tf32(kernels, shape):
    """float32 with TF32 allowed, B > 32 (the tensor-core tile, 16-wide k tiles; P = 16 in
    16-byte runs, P = 11 not): within float32's tolerance of the CPU model of TF32, within
    TF32's of the oracle, for one split and three."""
    kernels.glai_emulation_set_compute_capability(80)
    x, act, weight, dy = inputs(*shape, torch.float32, seed=sum(shape))
    expected, scale = oracle(x, act, weight, dy)
    model = _tf32_model(x, act, weight, dy)
    for splits in (1, 3):
        got = products(kernels, x, act, weight, dy, splits, tf32=True)
        for name, value in got.items():
            to_model = worst_error(value, model[name], scale[name])
            assert to_model <= tolerance(torch.float32), f"{name}: {to_model:.3g} off the model"
            error = worst_error(value, expected[name], scale[name])
            assert error <= tolerance(torch.float32, tf32=True), f"{name}: error {error:.3g}"


def test_tf32_rounds_where_allowed_and_only_there(kernels):
    """Known wrong for float32, by design: w = 1 + 2^-11 lies exactly halfway between two
    TF32 values, and x = act = dy = 1. TF32 rounds it away from zero to 1 + 2^-10 (not to
    even, which would give 1, nor by truncation), so each term is off by 2^-11 of itself:
    y = K·(1 + 2^-10) exactly, an error of 4.9e-4 of the scale, over float32's tolerance and
    within TF32's. Without TF32 allowed, at B <= 32 (the chains) and below sm_80, full float32
    gives K·(1 + 2^-11) exactly."""
    batch, width, paths, outputs = 40, 3, 5, 7  # width: I
    k = width * paths
    ones = torch.ones
    x, act, dy = ones(batch, width), ones(batch, paths), ones(batch, outputs)
    weight = torch.full((outputs, width, paths), 1 + 2.0 ** -11)
    expected, scale = oracle(x, act, weight, dy)
    kernels.glai_emulation_set_compute_capability(80)
    y = products(kernels, x, act, weight, dy, 1, names=("y",), tf32=True)["y"]
    assert torch.equal(y, torch.full_like(y, k * (1 + 2.0 ** -10)))
    error = worst_error(y, expected["y"], scale["y"])
    assert tolerance(torch.float32) < error <= tolerance(torch.float32, tf32=True)
    exact = torch.full((batch, outputs), k * (1 + 2.0 ** -11))
    cases = [(80, batch, False), (80, 16, True), (60, batch, True)]  # (arch, B, TF32 allowed)
    for arch, b, allowed in cases:
        kernels.glai_emulation_set_compute_capability(arch)
        y = products(kernels, x[:b], act[:b], weight, dy[:b], 1, names=("y",),
                     tf32=allowed)["y"]
        assert torch.equal(y, exact[:b]), (arch, b, allowed)
