"""The large-batch full-float32 tile (glai_kernels/csrc/cuda/simt_tile.cuh), run on the CPU.

float32 without TF32 (torch's default) at M, N >= 128 runs `large_tile_gemm`: 128x128 output
tiles, 8-wide k tiles through the 3-stage cp.async ring, 8x8 outputs a thread read from
shared memory as 16-byte vectors. The emulation (correctness/cuda_emulation/, see
test_cuda_emulated.py) runs it through the binding's C launcher; each product is compared with
the float64 oracle at float32's tolerance.

Every shape below gives the product under test M and N of at least 128 (the tile's rule) and
crosses each edge: two or three tiles each way with the last one partial, a last k tile
partial (K not a multiple of 8), K over more k tiles than the ring has stages, and split
counts that leave a split one tile (shorter than the ring) or a shorter last split. The
emulated vector loads fail the launch on a misaligned address, as the device would.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from cuda_emulated_kernels import (
    DTYPE_CODES,
    PRODUCTS,
    Problem,
    inputs,
    load,
    oracle,
    products,
    sizes_problem,
)

from reference import tolerance
from reference.tolerance import worst_error

F32 = torch.float32


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    lib = load(tmp_path_factory.mktemp("cuda_large_tile"))
    lib.glai_emulation_set_compute_capability(80)
    return lib


def _guarded(t: torch.Tensor, guard: int = 64) -> torch.Tensor:
    """t's values at the start of a buffer whose `guard` elements after it are NaN: a kernel
    that reads past the end of x, act or dy (a k past K) multiplies a NaN, which shows in the
    result even where it meets a zero."""
    buffer = torch.full((t.numel() + guard,), float("nan"), dtype=t.dtype)
    view = buffer[:t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _check(got: dict[str, torch.Tensor], expected, scale, label: str) -> None:
    for name, value in got.items():
        error = worst_error(value, expected[name], scale[name])
        assert error <= tolerance(F32), f"{name} {label}: error {error:.3g}"


# (product, (B, I, P, O)), each giving that product M, N >= 128; "runs": the weight's rows in
# 16-byte runs along the product's B operand (16-byte cp.async), "plain": not (plain loads).
#   y      M = B, N = O, K = I*P:  K = 60 (runs, 8 k tiles, the last half full) or 63 (plain);
#          N = 131 or 257 (3 column tiles)
#   dx     M = B, N = I, K = O*P:  P = 12 (runs) or 7 (plain); K = 60 or 63
#   dact   M = B, N = P, K = O*I:  P = 132 (runs) or 129 (plain); K = 55 or 52
#   dweight M = O, N = I*P, K = B: the formed x act operand, N = 135, K = B = 61
CASES = [
    ("y", (130, 5, 12, 131), "runs"), ("y", (129, 7, 9, 257), "plain"),
    ("dx", (130, 131, 12, 5), "runs"), ("dx", (129, 200, 7, 9), "plain"),
    ("dact", (130, 5, 132, 11), "runs"), ("dact", (131, 4, 129, 13), "plain"),
    ("dweight", (61, 5, 27, 130), "formed"),
]


@pytest.mark.parametrize("splits", [1, 3, 8], ids=["one-split", "three-splits", "eight-splits"])
@pytest.mark.parametrize(("product", "shape", "kind"), CASES,
                         ids=[f"{p}-{'x'.join(map(str, s))}-{k}" for p, s, k in CASES])
def test_large_tile_matches_oracle(kernels, product, shape, kind, splits):
    """Against the float64 oracle at float32's tolerance, with 1 split, 3 (8 k tiles: 3, 3,
    2) and 8 (one k tile each, the ring never full); x, act and dy followed by NaNs."""
    x, act, weight, dy = inputs(*shape, F32, seed=sum(shape) + splits)
    expected, scale = oracle(x, act, weight, dy)
    x, act, dy = (_guarded(t) for t in (x, act, dy))
    got = products(kernels, x, act, weight, dy, splits, names=(product,))
    _check(got, expected, scale, f"{kind}, {splits} splits")


@pytest.mark.parametrize("deferred", [0, 1], ids=["copies-at-once", "copies-at-wait"])
def test_large_tile_either_way_copies_land(kernels, deferred):
    """Right whether a cp.async lands when issued or only at its wait: y, dx and dact (the
    products that copy the weight; here in 16-byte runs) with 2 splits, each split's chain
    longer than the ring (dx: K = 5 * 132 = 660, 83 k tiles; y: K = 60, 8 tiles, 4 a split)."""
    kernels.glai_emulation_set_async_copies(deferred)
    try:
        x, act, weight, dy = inputs(130, 131, 132, 5, F32, seed=7)
        expected, scale = oracle(x, act, weight, dy)
        got = products(kernels, x, act, weight, dy, 2, names=("dx", "dact"))
        _check(got, expected, scale, f"deferred={deferred}")
        x, act, weight, dy = inputs(130, 5, 12, 131, F32, seed=8)
        expected, scale = oracle(x, act, weight, dy)
        got = products(kernels, x, act, weight, dy, 2, names=("y",))
        _check(got, expected, scale, f"deferred={deferred}")
    finally:
        kernels.glai_emulation_set_async_copies(1)


def test_large_tile_misaligned_weight_takes_plain_loads(kernels):
    """A weight 4 bytes past a 16-byte boundary has no 16-byte runs although K and P allow
    them: the tile must load it element by element (an emulated cp.async from it fails the
    launch as a misaligned address). y, dx and dact at their "runs" shapes above."""
    for product, shape, kind in CASES:
        if kind != "runs":
            continue
        x, act, weight, dy = inputs(*shape, F32, seed=5)
        storage = torch.empty(weight.numel() + 1)
        shifted = storage[1:].view(weight.shape)
        shifted.copy_(weight)
        assert shifted.data_ptr() % 16 != 0
        expected, scale = oracle(x, act, weight, dy)
        got = products(kernels, x, act, shifted, dy, 2, names=(product,))
        _check(got, expected, scale, "misaligned weight")


def test_large_tile_is_deterministic_and_split_order(kernels):
    """y with I = P = 8 (K = 64: k tile i of the tile's 8-wide tiles is input i) and 8 splits:
    each split's partial sums in the workspace are, bit for bit, the one-input problem
    y(x[:, i], w[:, i, :]) (so the 8-wide tile ran: the 16-wide simt_gemm would fill 4 of the
    8 slabs), the result is their float32 sum in split order, and a second run gives the same
    bits."""
    batch, outputs = 130, 131
    x, act, weight, dy = inputs(batch, 8, 8, outputs, F32, seed=13)
    problem = Problem(x.data_ptr(), act.data_ptr(), weight.data_ptr(), dy.data_ptr(), batch, 8,
                      8, outputs, DTYPE_CODES[F32], 0)
    assert kernels.glai_cuda_workspace_elements(ctypes.byref(problem), PRODUCTS["y"], 8) == (
        8 * batch * outputs)
    runs = []
    for _ in range(2):
        y = torch.full((batch, outputs), float("nan"))
        workspace = torch.full((8, batch, outputs), float("nan"))
        assert kernels.glai_cuda_launch(ctypes.byref(problem), PRODUCTS["y"], 8, y.data_ptr(),
                                        workspace.data_ptr(), None) == 0
        runs.append((y, workspace))
    assert torch.equal(runs[0][0], runs[1][0])
    total = torch.zeros(batch, outputs)
    for i in range(8):
        part = products(kernels, x[:, i:i + 1].contiguous(), act,
                        weight[:, i:i + 1].contiguous(), dy, 1, names=("y",))["y"]
        assert torch.equal(runs[0][1][i], part), f"split {i}"
        total = total + part
    assert torch.equal(runs[0][0], total)


def test_large_tile_split_rule(kernels):
    """glai_cuda_splits for full float32 at M, N >= 128 (simt_tile.cuh's model): 132 SMs,
    2 blocks each (264 slots), B = 4096 at the B heads."""
    def splits(b, i, p, o, product, sms=132, dtype=F32, tf32=False):
        problem = sizes_problem(b, i, p, o, dtype, tf32)
        return kernels.glai_cuda_splits(ctypes.byref(problem), PRODUCTS[product], sms)

    b1, b2 = (1281, 320, 128), (769, 384, 128)
    assert splits(4096, *b1, "y") == 8  # 32 tiles: 256 blocks, one wave
    assert splits(4096, *b2, "y") == 8
    assert splits(4096, *b1, "dx") == 3  # 32 x 11 = 352 tiles: 1,056 blocks, 4.0 waves
    assert splits(4096, *b2, "dx") == 7  # 32 x 7 = 224 tiles: 1,568 blocks, 5.9 waves
    assert splits(4096, *b1, "dact") == 8  # 32 x 3 = 96 tiles: 768 blocks, 2.9 waves
    assert splits(4096, *b1, "dweight") == 1  # 3,203 tiles
    assert splits(4096, 769, 256, 4, "dx") == 1  # C2: K = 1,024, the workspace would cost more
    # the rule holds a split to 16 k tiles of 8 at least: K = 8 * 16 * 3 allows 3
    assert splits(128, 3, 128, 128, "y") == 3
    # not the tile's: TF32 allowed (tensor cores, 64x64), float64, N < 128 (y at A1)
    assert splits(4096, *b1, "y", tf32=True) == 3
    assert splits(4096, *b1, "y", dtype=torch.float64) == 3
    assert splits(4096, 385, 128, 37, "y") == 5
