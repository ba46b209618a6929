"""The sparse estimator's checker: a sparse backend's forward and gradients against the float64
DENSE oracle on the masked weight (dvalues = the dense dweight at the kept entries), at the
dense tolerances; and the seeded cases and kept masks it and the raw-op tests draw.

Shared by test_sparse.py (every backend through the registry), test_sparse_cpp.py,
test_sparse_triton.py and test_kernel_adam.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import glai_kernels.sparse as sparse
from glai_kernels.sparse import from_dense
from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error


@dataclass(frozen=True)
class Case:
    """(B, I, P, O), the kept fraction mu (exact counts: `keep` entries), and an output
    left with no kept path."""

    shape: tuple[int, int, int, int]
    mu: float = 0.3
    keep: int | None = None
    empty_output: bool = False


def kept_mask(shape: tuple[int, int, int], case: Case, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 100)
    total = shape[0] * shape[1] * shape[2]
    keep = case.keep if case.keep is not None else round(case.mu * total)
    mask = torch.zeros(total, dtype=torch.bool)
    mask[torch.randperm(total, generator=gen)[:keep]] = True
    mask = mask.view(shape)
    if case.empty_output:
        mask[shape[0] // 2] = False
    return mask


def check_sparse(name: str, device: str, case: Case, *, dtype=torch.float32, seed=0,
                 gates="binary", bias=True, grads=("x", "act", "values", "bias"),
                 contiguous=True) -> list[str]:
    """What misses the dense float64 oracle on the masked weight (empty when all pass)."""
    batch, inputs, paths, outputs = case.shape
    data = make_inputs(batch, inputs, paths, outputs, dtype=dtype, device=device, seed=seed,
                       gates=gates, bias=bias)
    mask = kept_mask((outputs, inputs, paths), case, seed).to(device)
    sw = from_dense(data.weight, mask)
    x, act, b = data.x, data.act, data.bias
    if not contiguous:  # the same values through strided views
        x = torch.empty(inputs, batch, dtype=dtype, device=device).copy_(x.t()).t()
        spread = torch.empty(batch, 2 * paths, dtype=dtype, device=device)
        spread[:, ::2] = act
        act = spread[:, ::2]
        assert not x.is_contiguous() and not act.is_contiguous()
    tensors = {"x": x, "act": act, "values": sw.values, "bias": b}
    before = {n: t.detach().clone() for n, t in tensors.items() if t is not None}
    for n, t in tensors.items():
        if t is not None:
            t.requires_grad_(n in grads)
    dense = (data.weight * mask).detach()
    tol = tolerance(dtype)
    failures: list[str] = []

    def compare(quantity, actual, expected, scale):
        error = worst_error(actual, expected, scale)
        if not error <= tol or actual.dtype != dtype:
            failures.append(f"{quantity}: error {error:.3g} (tolerance {tol:.3g}), "
                            f"dtype {actual.dtype}")

    y = sparse.estimator(x, act, sw, b, backend=name)
    compare("y", y, forward64(x, act, dense, b), abs_forward64(x, act, dense, b))
    wanted = [n for n in ("x", "act", "values", "bias") if n in grads and tensors[n] is not None]
    if wanted:
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1),
                         dtype=torch.float64).to(device, dtype)
        got = torch.autograd.grad(y, [tensors[n] for n in wanted], dy)
        expected = grads64(dy, x, act, dense)._asdict()
        scale = abs_grads64(dy, x, act, dense)._asdict()
        kept = sw.entries()
        expected["values"], scale["values"] = expected["weight"][kept], scale["weight"][kept]
        for n, g in zip(wanted, got, strict=True):
            compare(f"d{n}", g, expected[n], scale[n])
    for n, t in before.items():
        if not torch.equal(tensors[n].detach(), t):
            failures.append(f"input {n} was modified")
    return failures


def sparse_problem(batch, inputs, paths, outputs, mu, dtype=torch.float32, seed=0, keep=None):
    """(x [B, I], act [B, P], values [K], index, dy [B, O]) for the raw glai_ext sparse ops:
    a seeded weight [O, I, P] keeping a fraction `mu` (or `keep` entries) of its paths."""
    gen = torch.Generator().manual_seed(seed)
    case = Case((batch, inputs, paths, outputs), mu=mu, keep=keep)
    mask = kept_mask((outputs, inputs, paths), case, seed)
    sw = from_dense(torch.randn(outputs, inputs, paths, generator=gen).to(dtype), mask)
    x = torch.randn(batch, inputs, generator=gen).to(dtype)
    act = torch.rand(batch, paths, generator=gen).to(dtype)
    dy = torch.randn(batch, outputs, generator=gen).to(dtype)
    return x, act, sw.values.detach(), list(sw.index), dy
