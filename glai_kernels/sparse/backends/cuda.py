"""`cuda` (sparse): fused CUDA kernels over the kept-path layout, in the glai_ext extension.

The ops `glai_ext::sparse_forward` / `glai_ext::sparse_backward` (schemas in
glai_kernels/csrc/sparse_schema.h, CUDA implementation in csrc/cuda/sparse_cuda_binding.cpp,
kernels in csrc/cuda/sparse_kernels.cu) walk the layout directly (layout.py):

    forward   a block per (output, batch tile): its rows split the output's (o, s) groups,
              each group's entries are summed into Zg[b, g], scaled by act[b, s_g] and added;
              the rows' partial sums are added in a fixed order (no atomics).
    dx        a block per (input, batch tile), over input_ptr / input_entries.
    dact      a block per (path, batch tile), over path_ptr / path_groups and Zg.
    dvalues   entries over blocks, the batch over a block's lanes, summed in lane order.

Threads run over the batch, so x, act and dy are transposed to [rows, B] first (B·(I+P+O)
elements); the kept group sums are saved as Zg^T [G, B] (float32 for half inputs) when act
needs a gradient. Every result is the same bits from run to run.

Built with the dense `cuda` backend's extension (glai_kernels/extension.py): available
where torch has CUDA, nvcc exists and a GPU is present; elsewhere unavailable with the reason.
"""

from __future__ import annotations

import torch

from glai_kernels.extension import cuda_availability
from glai_kernels.registry import Backend
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, SparseShape


def cuda_forward(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                 index: KeptIndex) -> torch.Tensor:
    """x [B, I], act [B, P], values [K] -> y [B, O]."""
    return torch.ops.glai_ext.sparse_forward(x, act, values, list(index), False)[0]


def cuda_forward_saving(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                        index: KeptIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """As cuda_forward, also returning Zg^T [G, B] (accumulation dtype) for dact."""
    y, zgt = torch.ops.glai_ext.sparse_forward(x, act, values, list(index), True)
    return y, zgt


def cuda_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: KeptIndex,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dvalues [K]), only those in `needs`;
    `saved` is the forward's Zg^T [G, B] (recomputed when absent and act needs a gradient)."""
    zgt = saved if saved is not None else dy.new_empty(0)
    grads = torch.ops.glai_ext.sparse_backward(dy, x, act, values, list(index), zgt,
                                               [bool(n) for n in needs])
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))  # type: ignore[return-value]


def saved_groups_shape_t(shape: SparseShape) -> tuple[int, int]:
    """Zg^T: [G, B]."""
    return (shape.groups, shape.batch)


SPARSE_ESTIMATOR.register(Backend(
    name="cuda",
    forward=cuda_forward,
    backward=cuda_backward,
    forward_saving=cuda_forward_saving,
    saved_shape=saved_groups_shape_t,
    devices=("cuda",),
    description="CUDA extension: fused gathers over the kept-path layout, batch on the lanes, "
                "fixed-order reductions (deterministic)",
    # above `torch` (10): one fused pass per product instead of CSR products and index_adds;
    # a roofline prediction (bench/NOTES.md, "cuda (sparse)"), not yet measured on a GPU
    auto_priority={"cuda": 20},
    availability=cuda_availability,
))
