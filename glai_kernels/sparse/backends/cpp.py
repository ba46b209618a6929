"""`cpp` (sparse): fused CPU kernels over the kept-path layout, in the glai_ext extension.

The ops `glai_ext::sparse_forward` and `glai_ext::sparse_backward` (glai_kernels/csrc/
cpu/cpu_sparse_binding.cpp, kernels in csrc/cpu/sparse_kernels.inc) are built with the dense `cpp`
backend's extension and share its run-time choice of instruction set (AVX-512, AVX2 or
portable; $GLAI_KERNELS_CPU_ISA or `torch.ops.glai_ext.cpu_isa(name)` force one). The batch
runs on the vector lanes: x, act and dy are transposed once per call to [rows, ld] (ld = B
rounded up to 16, zero padded, float32 for half inputs), so a kept entry costs one contiguous
load of B values and one FMA per vector. Four kernels, each parallel over items whose results
no other item touches (no atomics, a fixed summation order, the same bits for any thread
count):

    forward   over outputs o:  Zg[g] = sum_k v_k x^T[i_k],  y^T[o] = sum_g act^T[s_g] Zg[g]
    dvalues   over groups g:   dv[k] = <dy^T[o_g] act^T[s_g], x^T[i_k]>
    dx        over inputs i:   dx^T[i] = sum_{k of i} v_k dy^T[o_k] act^T[s_k]
    dact      over paths s:    dact^T[s] = sum_{g of s} dy^T[o_g] Zg[g]

The forward keeps Zg^T [G, ld] (float32 for half inputs) when act needs a gradient; dact then
costs B·G instead of recomputing the group sums. Without Zg and with small groups (fewer than
16 entries on average) the forward runs flat over each output's entries instead,
y^T[o] = sum_k (v_k act^T[s_k]) x^T[i_k]. Every index is range-checked (the inputs the hot loops
read by one vectorised pass per output or chunk of groups inside the kernel, the groups'
(o, s) per call, the rest per use): a corrupt index raises, it never reads or writes outside
its tensors. When B fits one to five vectors (B <= 80 with AVX-512) the forward and dvalues
run specialised loops; at two to five vectors, with x^T over 32 KB and long enough runs, they
walk the inputs in blocks whose x^T rows stay in L1 (each group's next run per block).
`glai_ext::sparse_dvalues_adam` runs dvalues and an Adam/AdamW update of the values in place,
chunk by chunk of groups (what FusedSparseStep calls). Eager calls with gradients record one C++
autograd node (`glai_ext::sparse_estimator_eager`, csrc/cpu/sparse_eager_autograd.cpp: the
backend's `eager`) instead of the op's Python Function. `torch.ops.glai_ext.sparse_min_work(n)`
sets the multiply-adds per thread below which a call uses fewer threads (0: always all of
torch's threads; a test hook).
Timings and each kernel's share of its bytes floor: docs/notes/sparse.md; rerun with
`glai-bench sparse-cpp-timing`.
"""

from __future__ import annotations

import torch

from glai_kernels import extension
from glai_kernels.registry import Backend
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, SparseShape

BATCH_PAD = extension.SPARSE_BATCH_PAD
"""Zg^T's row length is B rounded up to this (glai_cpu::sparse::kBatchPad)."""


def padded_batch(batch):
    """B rounded up to BATCH_PAD (works on SymInts too)."""
    return extension.sparse_saved_shape(0, batch, "cpu")[1]


def saved_groups_shape(shape: SparseShape) -> tuple[int, int]:
    """Zg^T: [G, B rounded up to BATCH_PAD]."""
    return (shape.groups, padded_batch(shape.batch))


def cpp_sparse_eager(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                     bias: torch.Tensor | None, save: bool, index: KeptIndex,
                     ones: bool = False) -> torch.Tensor:
    """y [B, O] recorded by autograd as one C++ node (csrc/cpu/sparse_eager_autograd.cpp): the
    sparse op's `eager` (glai_kernels/calls.py, `record`), the Backend's EagerFn with the
    index after `save`; `ones`: x lacks the constant-1 last input, which the node supplies
    (sparse/op.py, `run_resolved`)."""
    return extension.run_sparse_eager(x, act, values, bias, save, index, "cpp", ones)


cpp_sparse_eager.supplies_ones = True  # type: ignore[attr-defined]  (sparse/op.py reads it)


def cpp_auto_priority() -> dict[str, int]:
    """Above the `torch` sparse backend (10) on every CPU: forward + backward at μ = 1% measured
    1.4-2.9x faster than `torch` with each instruction set, the portable build included (B1
    and A1, B = 16 and 256, one thread; docs/notes/sparse.md, "Sparse kept-path estimator")."""
    return {"cpu": 20}


SPARSE_ESTIMATOR.register(Backend(
    name="cpp",
    forward=extension.run_sparse_forward,
    backward=extension.run_sparse_backward,
    forward_saving=extension.run_sparse_forward_saving,
    saved_shape=saved_groups_shape,
    devices=("cpu",),
    description="C++ extension: fused kept-path CPU kernels, batch on the vector lanes "
                "(AVX-512, AVX2, portable)",
    auto_priority=cpp_auto_priority(),
    availability=extension.cpu_availability,
    eager=cpp_sparse_eager,
))
