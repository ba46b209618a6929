"""`cuda`: the glai_ext extension's CUDA kernels (glai_kernels/csrc/cuda; built or loaded by
glai_kernels/extension.py on first need, when torch has CUDA and nvcc exists, or installed
ahead of time as glai_kernels._C).

Tiled GEMMs that form x⊗act in shared memory, split-K. At the paper's batch (B <= 32) y, dx and
dact run as short chains of k tiles that fill the GPU, the weight streamed through a 3-stage
cp.async pipeline, the partial sums reduced in split order (deterministic). At larger batch,
tensor cores (wmma) for bfloat16 and float16, and for float32 through TF32 exactly where torch
allows its own float32 matmuls to (`torch.backends.cuda.matmul.allow_tf32`, or
`torch.get_float32_matmul_precision()` other than "highest"; read by the binding per call),
full float32 otherwise. float16's y, dx and dact use the same tensor cores, each row of the
formed product x·act (dy·act, dy·x) scaled by a power of two so it cannot overflow, unscaled
exactly after the sum; float16's dweight runs on CUDA cores in float32 (docs/notes/cuda.md,
"float16 on tensor cores (issue 38, stop 46)").
They compute y in the one-GEMM form, which has no Z, so dact takes a GEMM of its own.
See docs/notes/cuda.md, "Short chains, cp.async and TF32 (issue 38, stop 45)".
"""

from __future__ import annotations

import torch

from glai_kernels import extension
from glai_kernels.registry import Backend, register


def cuda_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
    return extension.run_forward(x, act, weight, False)[0]


register(Backend(
    name="cuda",
    forward=cuda_forward,
    backward=extension.run_backward,  # glai_ext::backward, as the `cpp` backend's
    devices=("cuda",),
    description="CUDA extension: tiled GEMMs, x⊗act formed in shared memory, short split-K "
                "chains at B <= 32, tensor cores (wmma) for bfloat16, float16 and TF32 where torch "
                "allows it",
    auto_priority={"cuda": 20},
    availability=extension.cuda_availability,
))
