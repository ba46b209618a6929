"""`einsum`: the paper's Listing 1, the baseline every speedup is measured against.

Materialises outer [B, I, P] and contracts it with weight; never picked by auto.
`listing1_backward` is what autograd computes through those two einsums, written out so it
can run inside a custom op's backward. The tests' oracle package (`reference/`, not
installed) re-exports both.
"""

from __future__ import annotations

import torch

from glai_kernels.contract import Shape, accumulation_dtype
from glai_kernels.registry import Backend, register


def listing1_forward(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P], bias [O] or None -> y [B, O].

    Half inputs are computed in float32 (outer and the contraction) and y rounded once, as
    the contract's float32 accumulation says: a half outer product overflows at 65504.
    """
    dtype = x.dtype
    x, act, weight = _opmath(x, act, weight)
    outer = torch.einsum("bi,bs->bis", x, act)
    y = torch.einsum("bis,ois->bo", outer, weight)
    y = y if bias is None else y + _opmath(bias)[0]
    return y.to(dtype)


def listing1_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), each only where needed.

    As autograd through Listing 1 does: d_outer [B, I, P] = dy · weight, then reduce it
    against act (for dx) and x (for dact); dweight contracts dy with outer.
    """
    need_x, need_act, need_weight = needs
    dtype = x.dtype
    dy, x, act, weight = _opmath(dy, x, act, weight)  # float32 for half inputs, as above
    dx = dact = dweight = None
    if need_x or need_act:
        d_outer = torch.einsum("bo,ois->bis", dy, weight)
        if need_x:
            dx = torch.einsum("bis,bs->bi", d_outer, act)
        if need_act:
            dact = torch.einsum("bis,bi->bs", d_outer, x)
    if need_weight:
        outer = torch.einsum("bi,bs->bis", x, act)
        dweight = torch.einsum("bo,bis->ois", dy, outer)
    return tuple(None if g is None else g.to(dtype) for g in (dx, dact, dweight))  # type: ignore[return-value]


def _opmath(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor in its accumulation dtype (float32 for half types, else unchanged)."""
    return [t.to(accumulation_dtype(t.dtype)) for t in tensors]



def _workspace(s: Shape, forward: bool, grads: frozenset[str]) -> int:
    """The outer product [B, I, P] in the forward; in the backward its gradient [B, I, P]
    for dx or dact, and the outer product again for dweight."""
    bip = s.batch * s.inputs * s.paths
    if forward:
        return bip
    return (bip if {"x", "act"} & grads else 0) + (bip if "weight" in grads else 0)


register(Backend(
    name="einsum",
    forward=listing1_forward,
    backward=listing1_backward,
    devices=("cpu", "cuda"),
    description="the paper's Listing 1 (two einsums, materialises [B, I, P]); the baseline",
    baseline=True,
    workspace=_workspace,
))
