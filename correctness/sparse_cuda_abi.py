"""The sparse CUDA kernels' C interface as ctypes sees it, shared by the two emulated suites
that drive it (test_sparse_cuda_emulated.py: sparse_kernels.cu's passes;
test_sparse_step_cuda_emulated.py: sparse_step_kernels.cu's fused step)."""

from __future__ import annotations

import ctypes

import torch

from glai_kernels.sparse import KeptIndex

# estimator_kernels.cuh's glai_dtype
DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
INVALID_VALUE = 1  # cudaErrorInvalidValue


class SparseProblem(ctypes.Structure):
    """sparse_kernels.cuh's glai_sparse_problem: the transposed operands xt [I, B], actt [P, B],
    dyt [O, B], the values [K], the KeptIndex's arrays (layout.py's fields, in order), the
    sizes and the dtype's code."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("xt", "actt", "values", "dyt")]
    _fields_ += [(name, ctypes.c_void_p) for name in KeptIndex._fields]
    _fields_ += [(name, ctypes.c_int64) for name in ("batch", "inputs_count", "paths", "outputs",
                                                     "nnz", "groups")]
    _fields_ += [("dtype", ctypes.c_int)]


def ptr(t: torch.Tensor | None) -> int | None:
    """t's data pointer, or null for a missing or empty tensor (the launchers check for it)."""
    return t.data_ptr() if t is not None and t.numel() else None
