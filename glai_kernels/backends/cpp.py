"""`cpp`: the glai_ext extension's CPU kernels (glai_kernels/csrc/cpu; built or loaded by
glai_kernels/extension_build.py on first need, its ops wrapped by extension.py).

Fused, cache-blocked, vectorised kernels, runtime-dispatched between AVX-512 (with
AVX512_BF16 kernels for bfloat16), AVX2 and a portable build. The forward keeps
Z [B, O, P] (Z[b, o, s] = sum_i x[b, i] weight[o, i, s]) when act needs a gradient, so dact
costs B*O*P instead of a GEMM.
"""

from __future__ import annotations

import torch

from glai_kernels import extension
from glai_kernels.contract import Shape
from glai_kernels.registry import Backend, register


def cpp_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
    return extension.run_forward(x, act, weight, False)[0]


def cpp_forward_saving(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, O], Z [B, O, P])."""
    return extension.run_forward(x, act, weight, True)


cpp_backward = extension.run_backward
"""dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), only those in `needs`; `saved` is
the forward's Z, which makes dact cheap (glai_ext::backward, as the `cuda` backend's)."""


def cpp_eager(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, save: bool) -> torch.Tensor:
    """y [B, O] recorded by autograd as one C++ node (csrc/eager_autograd.cpp)."""
    return extension.run_eager(x, act, weight, bias, save, "cpp")


def cpp_auto_priority() -> dict[str, int]:
    """Above `torch` (10) on CPUs with AVX2 or AVX-512, where the float32 kernels measured 1.4x
    and 3.3x its forward+backward (docs/notes/cpu-kernels.md; float64, float16 and, with
    AVX512_BF16, bfloat16 are faster too); below it elsewhere, where only the portable build runs
    (0.4x).
    Read from torch's CPU capability, so choosing needs no build."""
    capability = torch.backends.cpu.get_cpu_capability()
    return {"cpu": 20 if capability in ("AVX2", "AVX512") else 5}


def saved_z_shape(shape: Shape) -> tuple[int, int, int]:
    return (shape.batch, shape.outputs, shape.paths)


def _workspace(s: Shape, forward: bool, grads: frozenset[str]) -> int:
    """Z [B, O, P], kept from the forward when act needs a gradient. (The kernels' own
    scratch buffers are small blocks, allocated outside torch.)"""
    return s.batch * s.outputs * s.paths if "act" in grads else 0


register(Backend(
    name="cpp",
    forward=cpp_forward,
    backward=cpp_backward,
    forward_saving=cpp_forward_saving,
    saved_shape=saved_z_shape,
    devices=("cpu",),
    description="C++ extension: fused cache-blocked CPU kernels (AVX-512, AVX512_BF16, AVX2, "
                "portable)",
    auto_priority=cpp_auto_priority(),
    availability=extension.cpu_availability,
    workspace=_workspace,
    eager=cpp_eager,
))
