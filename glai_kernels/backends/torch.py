"""`torch`: the estimator as plain PyTorch GEMMs that never materialise [B, I, P].

(This module is glai_kernels.backends.torch; `import torch` in it, and everywhere, is
PyTorch: imports are absolute.)

Forward (the Z-form of docs/ARCHITECTURE.md §2): Z[o] = x @ weight[o], one batched GEMM over the
contiguous
[I, P] slices of weight, then y[b, o] = sum_s Z[o, b, s] act[b, s]. Z is [O, B, P], small
next to [B, I, P] whenever O < I; when act needs a gradient the forward keeps it, because
    dact[b, s] = sum_o dy[b, o] Z[o, b, s]
then costs B*O*P instead of a fourth GEMM.

Half inputs (float16, bfloat16) run these formulas in float32 on float32 copies, results
rounded once at the end: the contract's float32 accumulation, with no half intermediate
(Z, the outer products, the partial sums) that could overflow or round early.

Backward, with weight viewed as W2 [O*I, P] (a free view of the contiguous weight):
    U = dy[b, o] x[b, i] as [B, O*I];  dact = U @ W2 (if Z was not kept);  dweight = U^T @ act
    V = dy[b, o] act[b, s] as [B, O*P];  dx = V @ weight^T viewed [O*P, I]
       (when B <= P: O GEMMs V_o [B, P] @ weight[o]^T summed over o, no copy of weight)
Each is one GEMM with K in {O*I, B, O*P}. The measurements behind these choices are in
docs/notes/cpu-kernels.md.
"""

from __future__ import annotations

import torch

from glai_kernels.contract import Shape, accumulation_dtype
from glai_kernels.registry import Backend, register


def _opmath(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors in their accumulation dtype (float32 for half ones, a no-op otherwise).

    Half inputs are computed entirely in float32, including the outer products dy·x and
    dy·act that the backward GEMMs take as operands: a half GEMM would round those, and
    Z, to the half type, and a partial sum past 65504 would overflow where the exact
    result does not (docs/ARCHITECTURE.md §1).
    """
    return [t.to(accumulation_dtype(t.dtype)) for t in tensors]


def _z(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, weight)  # [O, B, P]


def _contract_z(z: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    # y[b, o] = sum_s z[o, b, s] act[b, s]
    return (z * act).sum(-1).t()


def torch_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
    x32, act32, w32 = _opmath(x, act, weight)
    return _contract_z(_z(x32, w32), act32).to(x.dtype)


def torch_forward_saving(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As torch_forward, also returning Z [O, B, P] (in the accumulation dtype) for a cheap
    dact."""
    x32, act32, w32 = _opmath(x, act, weight)
    z = _z(x32, w32)
    return _contract_z(z, act32).to(x.dtype), z


def torch_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), only those in `needs`.

    `saved`, when given, is the forward's Z [O, B, P].
    """
    need_x, need_act, need_weight = needs
    dtype = x.dtype
    dy, x, act, weight = _opmath(dy, x, act, weight)
    batch, inputs = x.shape
    outputs, _, paths = weight.shape
    dx = dact = dweight = None
    if need_act and saved is not None:
        dact = torch.bmm(dy.unsqueeze(1), saved.transpose(0, 1)).squeeze(1)
    if (need_act and dact is None) or need_weight:
        u = (dy.unsqueeze(2) * x.unsqueeze(1)).view(batch, outputs * inputs)
        if need_act and dact is None:
            dact = u @ weight.view(outputs * inputs, paths)
        if need_weight:
            dweight = (u.t() @ act).view(outputs, inputs, paths)
    if need_x:
        if batch <= paths:
            # Small batch: O GEMMs V_o [B, P] @ weight[o]^T, read in place, then a sum over
            # o. The copy below writes O*I*P elements, more than the [O, B, I] partials here
            # when B <= P, and at B = 16 the copy cost 3x the GEMMs (A1: 3.0 -> 0.8 ms,
            # docs/notes/cpu-kernels.md "Small batch").
            v = dy.t().unsqueeze(2) * act.unsqueeze(0)  # [O, B, P]
            dx = torch.bmm(v, weight.transpose(1, 2)).sum(0)
        else:
            v = (dy.unsqueeze(2) * act.unsqueeze(1)).view(batch, outputs * paths)
            # One GEMM with K = O*P beats O small ones; the transposed copy of weight is
            # cheap next to it (O*I*P elements against 2*B*O*I*P flops).
            dx = v @ weight.transpose(1, 2).reshape(outputs * paths, inputs)
    return tuple(None if g is None else g.to(dtype) for g in (dx, dact, dweight))  # type: ignore[return-value]


def saved_z_shape(shape: Shape) -> tuple[int, int, int]:
    return (shape.outputs, shape.batch, shape.paths)


def gemm_workspace(s: Shape, forward: bool, grads: frozenset[str]) -> int:
    """Elements of the intermediates above: Z [O, B, P] in every forward (kept for the
    backward when act needs a gradient); U [B, O*I] for dact or dweight; V [B, O*P] and the
    transposed copy of weight [O*P, I] (or, when B <= P, partials [O, B, I]) for dx. For
    half inputs these are float32 (two elements of the input dtype each) and float32 copies
    of the inputs join them; the count here is of elements, as for the other dtypes."""
    b, i, p, o = s.batch, s.inputs, s.paths, s.outputs
    z = o * b * p
    if forward:
        return z
    kept = z if "act" in grads else 0
    u = b * o * i if {"act", "weight"} & grads else 0
    # dx: V and either the transposed copy of weight or, when B <= P, the [O, B, I] partials
    v = b * o * p + (o * b * i if b <= p else o * i * p) if "x" in grads else 0
    return kept + u + v


register(Backend(
    name="torch",
    forward=torch_forward,
    backward=torch_backward,
    forward_saving=torch_forward_saving,
    saved_shape=saved_z_shape,
    workspace=gemm_workspace,
    devices=("cpu", "cuda"),
    description="plain PyTorch GEMMs, never materialises [B, I, P]",
    auto_priority={"cpu": 10, "cuda": 10},
))
