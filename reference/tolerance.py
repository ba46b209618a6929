"""One tolerance per dtype, and the check every backend's output must pass.

An error is measured against the sum of absolute values of the terms that make up each output
element (`abs_forward64`, `abs_grads64`): a sum of n products rounded in a precision with unit
roundoff u is off by at most about (n·u) times that sum in the worst case, and by a few u times
it in practice, since the roundings do not line up. Each tolerance is a few units of its
dtype's roundoff on that scale, so a right kernel passes for any K = I·P and a wrong one, whose
error is of the order of the sum itself, fails:

- float64: 1e-12 (u = 1.1e-16; blocked sums of up to ~1e6 terms).
- float32: 1e-5 (u = 6.0e-8, about 170 u); TF32 matmuls (u = 4.9e-4) take float16's.
- float16: 2e-3 (u = 4.9e-4: the inputs' products, one rounding of partial sums, the output).
- bfloat16: 1.6e-2 (u = 3.9e-3, the same four units).
"""

from __future__ import annotations

import math

import torch

TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
TF32_TOLERANCE = TOLERANCE[torch.float16]


def tolerance(dtype: torch.dtype, tf32: bool = False) -> float:
    """The relative tolerance, on the absolute-sum scale, for results computed in `dtype`."""
    if dtype == torch.float32 and tf32:
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


# elements per step of `worst_error`: its float64 temporaries (2 MiB) stay in the L2 cache
WORST_ERROR_CHUNK = 1 << 18


def worst_error(actual: torch.Tensor, expected64: torch.Tensor, scale64: torch.Tensor) -> float:
    """max |actual - expected| / scale over the elements, in float64 (0/0 counts as 0).

    An element whose scale is 0 is a sum of zero terms, so any error there is infinite.

    Computed in steps of WORST_ERROR_CHUNK elements, and where every scale of a step is
    positive in three in-place passes (difference, abs, quotient) and a max that carries a NaN
    through: 6-7× faster on a 52M-element dweight (B1's) than whole-tensor temporaries, the
    same result in every case (correctness/test_reference.py)."""
    if actual.shape != expected64.shape:
        raise ValueError(f"shape {list(actual.shape)} differs from the oracle's "
                         f"{list(expected64.shape)}")
    values = actual.detach().reshape(-1)
    expected, scales = expected64.reshape(-1), scale64.reshape(-1)
    worst = 0.0
    for start in range(0, values.numel(), WORST_ERROR_CHUNK):
        part = slice(start, start + WORST_ERROR_CHUNK)
        # in float64 whatever the two dtypes (`to` may return the caller's own chunk: not
        # written in place)
        err = torch.sub(values[part].to(torch.float64), expected[part]).abs_()
        scale = scales[part]
        if bool((scale > 0).all()):
            ratio = float(err.div_(scale).max())  # NaN if any quotient is
            ratio = math.inf if math.isnan(ratio) else ratio
        else:
            ratio = _worst_ratio_with_empty_sums(err, scale)
        if ratio == math.inf:
            return ratio
        worst = max(worst, ratio)
    return worst


def _worst_ratio_with_empty_sums(err: torch.Tensor, scale: torch.Tensor) -> float:
    """`worst_error` of one step where some scale is not positive (a sum of no terms)."""
    has_terms = scale > 0
    ratio = torch.where(has_terms, err / torch.where(has_terms, scale, 1.0),
                        torch.where(err > 0, torch.inf, 0.0))
    return float(torch.nan_to_num(ratio, nan=torch.inf, posinf=torch.inf).max())


def is_close(actual: torch.Tensor, expected64: torch.Tensor, scale64: torch.Tensor,
             dtype: torch.dtype, tf32: bool = False) -> bool:
    """Whether `actual` is within its dtype's tolerance of the float64 oracle."""
    return worst_error(actual, expected64, scale64) <= tolerance(dtype, tf32)
