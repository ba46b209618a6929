"""The sparse estimator's checker: a sparse backend's forward and gradients against the float64
DENSE oracle on the masked weight (dvalues = the dense dweight at the kept entries), at the
dense tolerances; and the seeded cases and kept masks it and the raw-op tests draw.

Shared by test_sparse.py (every backend through the registry), test_sparse_cpp.py,
test_sparse_triton.py and test_kernel_adam.py; `oracle_failures` also by test_properties.py's
sparse fuzzer, which draws its own cases and judges with its own verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import glai_kernels.sparse as sparse
from glai_kernels.sparse import SparsePathWeight, from_dense
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
    dense = (data.weight * mask).detach()
    tol = tolerance(dtype)

    def compare(quantity, actual, expected, scale):
        error = worst_error(actual, expected, scale)
        if not error <= tol or actual.dtype != dtype:
            return f"{quantity}: error {error:.3g} (tolerance {tol:.3g}), dtype {actual.dtype}"
        return None

    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(seed + 1),
                     dtype=torch.float64).to(device, dtype)
    return oracle_failures(name, tensors, set(grads), sw, dense, dy, compare)


Compare = Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], "str | None"]
"""(quantity, actual, expected float64, its absolute-sum scale) -> a failure message, or None."""


def oracle_failures(name: str, tensors: dict[str, torch.Tensor | None], needs: set[str],
                    sw: SparsePathWeight, dense: torch.Tensor, dy: torch.Tensor,
                    compare: Compare) -> list[str]:
    """What of sparse.estimator on backend `name` misses the float64 dense oracle on the
    masked weight (empty when everything passes): y, then the gradient of each tensor named
    in `needs` (dvalues = the dense dweight at the kept entries), each judged by `compare`;
    and every input must be left as it was. `tensors` maps "x" [B, I], "act" [B, P], "values"
    (sw.values) and "bias" [O] (or None) to the call's inputs, whose requires_grad this sets
    from `needs`; `dense` is the masked weight [O, I, P]; dy is [B, O]."""
    present = {n: t for n, t in tensors.items() if t is not None}
    before = {n: t.detach().clone() for n, t in present.items()}
    for n, t in present.items():
        t.requires_grad_(n in needs)
    x, act, bias = tensors["x"], tensors["act"], tensors.get("bias")
    failures: list[str] = []

    def judge(quantity, actual, expected, scale):
        failure = compare(quantity, actual, expected, scale)
        if failure is not None:
            failures.append(failure)

    y = sparse.estimator(x, act, sw, bias, backend=name)
    judge("y", y, forward64(x, act, dense, bias), abs_forward64(x, act, dense, bias))
    wanted = [n for n in present if n in needs]
    if wanted:
        got = torch.autograd.grad(y, [present[n] for n in wanted], dy, allow_unused=True)
        expected = grads64(dy, x, act, dense)._asdict()
        scale = abs_grads64(dy, x, act, dense)._asdict()
        kept = sw.entries()
        expected["values"], scale["values"] = expected["weight"][kept], scale["weight"][kept]
        for n, g in zip(wanted, got, strict=True):
            if g is None:
                failures.append(f"d{n}: no gradient")
            else:
                judge(f"d{n}", g, expected[n], scale[n])
    for n, t in before.items():
        if not torch.equal(present[n].detach(), t):
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
