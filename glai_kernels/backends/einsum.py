"""`einsum`: the paper's Listing 1, the oracle. Materialises [B, I, P]; never picked by auto."""

from glai_kernels.registry import Backend, register
from reference import listing1_backward, listing1_forward

register(Backend(
    name="einsum",
    forward=listing1_forward,
    backward=listing1_backward,
    devices=("cpu", "cuda"),
    description="the paper's Listing 1 (two einsums, materialises [B, I, P]); the oracle",
    baseline=True,
))
