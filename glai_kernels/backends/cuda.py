"""`cuda`: the glai_ext extension's CUDA kernels (glai_kernels/csrc/cuda; built or loaded by
glai_kernels/extension.py on first need, when torch has CUDA and nvcc exists, or installed
ahead of time as glai_kernels._C).

Tiled GEMMs that form x⊗act in shared memory, tensor cores (wmma) for half types, split-K.
They compute y in the one-GEMM form, which has no Z, so dact takes a GEMM of its own.
"""

from __future__ import annotations

import torch

from glai_kernels import extension
from glai_kernels.registry import Backend, register


def cuda_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
    return extension.run_forward(x, act, weight, False)[0]


def cuda_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), only those in `needs`."""
    return extension.run_backward(dy, x, act, weight, needs, saved)



register(Backend(
    name="cuda",
    forward=cuda_forward,
    backward=cuda_backward,
    devices=("cuda",),
    description="CUDA extension: tiled GEMMs, x⊗act formed in shared memory, tensor cores "
                "(wmma) for half types, split-K",
    auto_priority={"cuda": 20},
    availability=extension.cuda_availability,
))
