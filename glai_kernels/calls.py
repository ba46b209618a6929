"""How an op calls a backend: the results checked against the contract, whatever the op.

The dense op (`glai_kernels/op.py`) and the sparse kept-path op (`glai_kernels/sparse/op.py`)
differ in their arguments, not in how they call a backend: contiguous inputs, a saving forward
when the backward will want it, each result of the shape and dtype the contract says (else a
RuntimeError naming the backend), and an empty tensor for each gradient not asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glai_kernels.contract import accumulation_dtype
from glai_kernels.registry import Backend


def checked(impl: Backend, what: str, result: torch.Tensor | None,
            shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A backend's result, contiguous, once its shape and dtype are what the contract says."""
    if result is None or tuple(result.shape) != tuple(shape) or result.dtype != dtype:
        got = "nothing" if result is None else f"{result.dtype} {list(result.shape)}"
        op = "" if impl.op in ("", "estimator") else f" ({impl.op})"
        raise RuntimeError(f"backend {impl.name!r}{op} returned {got} for {what}, expected "
                           f"{dtype} {list(shape)}")
    return result.contiguous()


def saves(impl: Backend, save: bool, empty: bool) -> bool:
    """Whether a forward keeps a tensor for its backward: asked for, offered, and not empty."""
    return save and impl.forward_saving is not None and not empty


def forward(impl: Backend, args: Sequence, out_shape: Sequence[int], dtype: torch.dtype,
            saved_shape: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, saved) from `impl` on `args` (tensors already contiguous): its saving forward when
    `saved_shape` is given (saved then in the accumulation dtype), else its plain forward."""
    if saved_shape is not None:
        y, saved = impl.forward_saving(*args)
        saved = checked(impl, "saved", saved, saved_shape, accumulation_dtype(dtype))
    else:
        y, saved = impl.forward(*args), None
    return checked(impl, "y", y, out_shape, dtype), saved


def backward(impl: Backend, args: Sequence, saved: torch.Tensor,
             wrt: Sequence[tuple[str, torch.Tensor]], needs: Sequence[bool],
             empty: bool) -> tuple[torch.Tensor, ...]:
    """The gradients for `wrt` ((name, input) pairs, in the backend's return order): zeros when
    the problem is `empty`, else `impl.backward(*args, needs)` (with `saved=` when the forward
    kept something), each checked; an empty [0] tensor for each one not in `needs` (a custom
    op cannot return None, and its outputs may not alias)."""
    needs = tuple(bool(n) for n in needs)
    if empty:
        grads = tuple(torch.zeros_like(t) if need else None
                      for (_, t), need in zip(wrt, needs, strict=True))
    else:
        call = (*args, needs)
        computed = impl.backward(*call, saved=saved) if saved.numel() else impl.backward(*call)
        grads = tuple(checked(impl, f"d{name}", g, t.shape, t.dtype) if need else None
                      for (name, t), g, need in zip(wrt, computed, needs, strict=True))
    like = wrt[0][1]
    return tuple(g if g is not None else like.new_empty(0) for g in grads)
