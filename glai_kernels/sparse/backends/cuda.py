"""`cuda` (sparse): fused CUDA kernels over the kept-path layout, in the glai_ext extension.

The ops `glai_ext::sparse_forward` / `glai_ext::sparse_backward` (schemas in
glai_kernels/csrc/schema.cpp, CUDA implementation in csrc/cuda/cuda_sparse_binding.cpp,
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

Built with the dense `cuda` backend's extension (glai_kernels/extension_build.py): available
where torch has CUDA, nvcc exists and a GPU is present; elsewhere unavailable with the reason.
"""

from __future__ import annotations

from glai_kernels import extension
from glai_kernels.registry import Backend
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, groups_by_batch

SPARSE_ESTIMATOR.register(Backend(
    name="cuda",
    forward=extension.run_sparse_forward,
    backward=extension.run_sparse_backward,
    forward_saving=extension.run_sparse_forward_saving,
    saved_shape=groups_by_batch,
    devices=("cuda",),
    description="CUDA extension: fused gathers over the kept-path layout, batch on the lanes, "
                "fixed-order reductions (deterministic)",
    # above `torch` (10): one fused pass per product instead of CSR products and index_adds;
    # a roofline prediction (docs/notes/sparse.md, "cuda (sparse)"), not yet measured on a GPU
    auto_priority={"cuda": 20},
    availability=extension.cuda_availability,
))
