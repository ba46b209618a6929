"""The `cuda` backend's float32 on a GPU under torch's TF32 switches (issue 38): each mode with
its own tolerance.

The kernels may round float32 GEMM operands to TF32 exactly where torch lets its own float32
matmuls (`torch.backends.cuda.matmul.allow_tf32`, or `torch.get_float32_matmul_precision()`
other than "highest"; the binding reads both per call). By default neither is set and every
product must meet float32's tolerance; with either set, the large-batch tiles run on TF32
tensor cores (sm_80+) and must meet TF32's (reference/tolerance.py, derived in
correctness/test_cuda_emulated.py's docstring), and on an input built to show the rounding
they must miss float32's: that proves the switch reached the kernels. The CPU emulation
(test_cuda_emulated.py) checks the same kernels' logic without a GPU; this file needs one.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from checker import check

import glai_kernels
from glai_kernels import registry
from reference import abs_forward64, forward64, tolerance
from reference.tolerance import worst_error

pytestmark = pytest.mark.cuda


def _cuda_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    return registry.get("cuda").unsupported_reason("cuda", torch.float32)


@pytest.fixture(autouse=True)
def _needs_cuda_backend():
    reason = _cuda_reason()
    if reason is not None:
        pytest.skip(f"cuda backend: {reason}")


@contextlib.contextmanager
def _tf32(allow: bool | None = None, precision: str | None = None):
    """torch's two switches set for the block, restored after it."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32, torch.get_float32_matmul_precision()
    try:
        if precision is not None:
            torch.set_float32_matmul_precision(precision)
        if allow is not None:
            matmul.allow_tf32 = allow
        yield
    finally:
        torch.set_float32_matmul_precision(saved[1])
        matmul.allow_tf32 = saved[0]


def _fn(x, act, weight, bias):
    return glai_kernels.estimator(x, act, weight, bias, backend="cuda")


# B > 32 puts every product on the large-batch tiles; B = 16 puts y, dx and dact on the chains
SHAPES = [(70, 6, 11, 67), (256, 33, 16, 5), (16, 385, 128, 37)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("allow", "precision"), [(False, "highest"), (True, "highest"),
                                                   (False, "high")],
                         ids=["float32", "allow_tf32", "precision-high"])
def test_each_mode_meets_its_tolerance(shape, allow, precision):
    tf32 = allow or precision != "highest"
    with _tf32(allow, precision):
        failures = check(_fn, *shape, device="cuda", seed=sum(shape), gates="soft", tf32=tf32)
    assert not failures, "; ".join(str(f) for f in failures)


@pytest.mark.parametrize(("allow", "precision"), [(True, "highest"), (False, "high")],
                         ids=["allow_tf32", "precision-high"])
def test_tf32_reaches_the_kernels(allow, precision):
    """w = 1 + 2^-11, halfway between two TF32 values, with x = act = 1 at B = 64: TF32 gives
    y = K (1 + 2^-10), 4.9e-4 of the scale off, over float32's tolerance and within TF32's;
    full float32 gives K (1 + 2^-11) exactly. Needs sm_80 (TF32 tensor cores)."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 tensor cores need sm_80")
    batch, inputs, paths, outputs = 64, 3, 16, 70
    x = torch.ones(batch, inputs, device="cuda")
    act = torch.ones(batch, paths, device="cuda")
    weight = torch.full((outputs, inputs, paths), 1 + 2.0 ** -11, device="cuda")
    expected = forward64(x.double(), act.double(), weight.double())
    scale = abs_forward64(x.double(), act.double(), weight.double())
    with _tf32(allow, precision):
        y = glai_kernels.estimator(x, act, weight, backend="cuda")
    error = worst_error(y, expected, scale)
    assert tolerance(torch.float32) < error <= tolerance(torch.float32, tf32=True)
    with _tf32(False, "highest"):
        y = glai_kernels.estimator(x, act, weight, backend="cuda")
    assert torch.equal(y.cpu(), torch.full((batch, outputs), inputs * paths * (1 + 2.0 ** -11)))
