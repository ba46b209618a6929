"""The float dweight stored past the caches from 32 MiB (csrc/cpu/kernels.inc,
kDweightStreamBytes): a result larger than the L3 and smaller than kStreamBytes' 64 MiB, the
size of stacked heads' folded dweight under vmap (docs/notes/cpu-kernels.md, "vmap over stacked
heads, fourth pass (issue 43, stop 48)"), has the bits of the same rows stored through the
caches.
"""

from __future__ import annotations

import pytest
import torch

from glai_kernels.backends.cpp import cpp_backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_streamed_dweight_between_32_and_64_mib_has_the_bits_of_a_cached_one(built, dtype):
    """dweight [O, 129, 256] at B = 3: O = 300 float32 (39.6 MB) or 150 float64 (the same
    bytes), rows of whole cache lines, so its full tiles are streamed; the last, partial row
    block of i (129 = 21 x 6 + 3) is not. Each dweight[o] depends on o's column of dy alone, so
    its first and last five o's must be, bit for bit, those of a 660 KB or 1.3 MB dweight
    (stored through the caches) of the same inputs; and the whole against float64's einsum."""
    g = torch.Generator().manual_seed(48)
    batch, inputs, paths = 3, 129, 256
    outputs = 300 if dtype == torch.float32 else 150
    x = torch.randn(batch, inputs, generator=g, dtype=dtype)
    act = torch.randn(batch, paths, generator=g, dtype=dtype)
    dy = torch.randn(batch, outputs, generator=g, dtype=dtype)
    weight = torch.zeros(outputs, inputs, paths, dtype=dtype)  # only its shape is read
    big = cpp_backward(dy, x, act, weight, (False, False, True))[2]
    assert 32 << 20 <= big.numel() * big.element_size() < 64 << 20
    for part in (slice(0, 5), slice(outputs - 5, outputs)):
        small = cpp_backward(dy[:, part].contiguous(), x, act, weight[part].contiguous(),
                             (False, False, True))[2]
        assert torch.equal(big[part], small)
    expected = torch.einsum("bo,bi,bs->ois", dy.double(), x.double(), act.double())
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(big.double(), expected, rtol=tolerance, atol=tolerance)
