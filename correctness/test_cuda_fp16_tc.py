"""The `cuda` backend's float16 on tensor cores, on a GPU (issue 38): y, dx and dact at B > 32
run on wmma from sm_80 with each row of the formed operand scaled by a power of two
(estimator_kernels.cu's header comment; docs/notes/cuda.md, "float16 on tensor cores (issue 38,
stop 46)"). The CPU emulation (test_cuda_fp16_tc_emulated.py) checks the same kernels' logic,
with a planted unscaled copy; this file checks the hardware, and skips without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from checker import check

import glai_kernels
from glai_kernels import registry

pytestmark = pytest.mark.cuda

H = torch.float16


@pytest.fixture(autouse=True)
def _needs_cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    reason = registry.get("cuda").unsupported_reason("cuda", H)
    if reason is not None:
        pytest.skip(f"cuda backend: {reason}")


def _fn(x, act, weight, bias):
    return glai_kernels.estimator(x, act, weight, bias, backend="cuda")


# B > 32: the tensor-core tile (crossing its 64-wide edges at 70 and 67); B = 4096 at a small
# head; B = 16: the chains (CUDA cores), for contrast
SHAPES = [(70, 6, 11, 67), (256, 33, 16, 5), (4096, 13, 16, 37), (16, 385, 128, 37)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float16_meets_its_tolerance(shape):
    failures = check(_fn, *shape, dtype=H, device="cuda", seed=sum(shape), gates="soft")
    assert not failures, "; ".join(str(f) for f in failures)


def test_formed_products_past_the_half_range():
    """x = act = 320 (x·act = 102400 > 65504), w = 2^-8, B = 64: y = 400 exactly, and with
    dy = 320 dx = dact = 400 exactly; unscaled, the tensor cores would give inf. sm_80+ runs
    the tensor cores; below, the CUDA cores must give the same."""
    batch = 64
    x = torch.full((batch, 1), 320.0, dtype=H, device="cuda", requires_grad=True)
    act = torch.full((batch, 1), 320.0, dtype=H, device="cuda", requires_grad=True)
    weight = torch.full((1, 1, 1), 2.0 ** -8, dtype=H, device="cuda")
    y = glai_kernels.estimator(x, act, weight, backend="cuda")
    assert torch.equal(y.cpu(), torch.full((batch, 1), 400.0, dtype=H))
    y.backward(torch.full_like(y, 320.0))
    assert torch.equal(x.grad.cpu(), torch.full((batch, 1), 400.0, dtype=H))
    assert torch.equal(act.grad.cpu(), torch.full((batch, 1), 400.0, dtype=H))
