"""`einsum`: the paper's Listing 1, the oracle. Materialises [B, I, P]; never picked by auto."""

from glai_kernels.contract import Shape
from glai_kernels.registry import Backend, register
from reference import listing1_backward, listing1_forward


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
    description="the paper's Listing 1 (two einsums, materialises [B, I, P]); the oracle",
    baseline=True,
    workspace=_workspace,
))
