"""The estimator's contract, stated once: argument checks and costs (docs/ARCHITECTURE.md §1 and
§2).

    y[b, o] = sum_i sum_s x[b, i] * act[b, s] * weight[o, i, s] + bias[o]

    x      [B, I]     act [B, P]     weight [O, I, P]     bias [O] or None     y [B, O]

Every entry point (the custom op, its fake implementation, the benchmarks) calls
`check_inputs`, so a bad argument gets the same message wherever it enters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
)
HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
GRADIENTS: tuple[str, ...] = ("x", "act", "weight")

Pass = Literal["forward", "backward", "both"]


@dataclass(frozen=True)
class Shape:
    """The four sizes of one estimator call: B, I, P, O."""

    batch: int
    inputs: int
    paths: int
    outputs: int

    @property
    def gemm_k(self) -> int:
        """K of the one-GEMM view (docs/ARCHITECTURE.md §2): M = B, N = O, K = I * P."""
        return self.inputs * self.paths

    def forward_flops(self) -> int:
        """2·B·I·P·O: one multiply and one add per (b, o, i, s)."""
        return 2 * self.batch * self.inputs * self.paths * self.outputs

    def gradient_flops(self, grad: str) -> int:
        """The fewest FLOPs of one gradient (docs/ARCHITECTURE.md §2.1): dx and dweight
        2·B·I·P·O each (a GEMM with a Khatri-Rao operand), dact 2·B·O·P from the forward's
        kept Z (dact[b, s] = sum_o dy[b, o]·Z[b, o, s])."""
        if grad == "act":
            return 2 * self.batch * self.outputs * self.paths
        if grad in ("x", "weight"):
            return self.forward_flops()
        raise ValueError(f"unknown gradient {grad!r}; known: {', '.join(GRADIENTS)}")

    def flops(self, pass_: Pass = "forward", grads: tuple[str, ...] = GRADIENTS) -> int:
        """The fewest floating-point operations the pass needs: forward 2·B·I·P·O; a backward
        computing `grads` the sum of their `gradient_flops` (dact at 2·B·O·P from a kept
        Z); "both" the two. A minimum: a backend that recomputes dact does more."""
        backward = sum(self.gradient_flops(g) for g in grads)
        return {"forward": self.forward_flops(), "backward": backward,
                "both": self.forward_flops() + backward}[pass_]

    def min_elements(self, pass_: Pass = "forward", grads: tuple[str, ...] = GRADIENTS) -> int:
        """Fewest elements read or written once each (docs/ARCHITECTURE.md §2.2); the backward
        computes `grads`. dact alone reads dy and the cheaper of the kept Z [B, O, P] and the
        (x, weight) it could be recomputed from, so the count stays a lower bound for either
        algorithm (Z counted in elements, though the CPU kernels keep it in float32)."""
        b, i, p, o = self.batch, self.inputs, self.paths, self.outputs
        size = {"x": b * i, "act": b * p, "weight": o * i * p}
        forward = b * i + b * p + o * i * p + b * o
        # the backward reads dy and the inputs each gradient needs (the other two), and
        # writes each gradient: all three read dy, x, act, weight and write dx, dact, dweight
        read = {other for g in grads for other in GRADIENTS if other != g}
        backward = b * o + sum(size[t] for t in read) + sum(size[g] for g in grads)
        if tuple(grads) == ("act",):
            backward = b * o + min(b * o * p, size["x"] + size["weight"]) + size["act"]
        return {"forward": forward, "backward": backward, "both": forward + backward}[pass_]

    def min_bytes(self, itemsize: int, pass_: Pass = "forward",
                  grads: tuple[str, ...] = GRADIENTS) -> int:
        return self.min_elements(pass_, grads) * itemsize

    def as_dict(self) -> dict[str, int]:
        return {"batch": self.batch, "inputs": self.inputs, "paths": self.paths,
                "outputs": self.outputs}


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-d {t.dtype} tensor of shape {list(t.shape)} on {t.device}"
    return f"{type(t).__name__}"


def _require_tensor(name: str, t: object, rank: int, dims: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"estimator: {name} must be a tensor {dims}, got {_describe(t)}")
    if t.dim() != rank:
        raise ValueError(
            f"estimator: {name} must be {rank}-d {dims}, got {_describe(t)}")
    return t


def check_inputs(
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> Shape:
    """Check ranks, sizes, dtypes and devices; return the call's Shape.

    Raises ValueError (shapes, devices) or TypeError (dtypes, non-tensors), each message
    naming the argument, what was expected and what came.
    """
    _require_tensor("x", x, 2, "[B, I]")
    _require_tensor("act", act, 2, "[B, P]")
    _require_tensor("weight", weight, 3, "[O, I, P]")
    if bias is not None:
        _require_tensor("bias", bias, 1, "[O]")

    dtype, device = x.dtype, x.device
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"estimator: x must have a floating dtype ({names}), got {dtype}")
    # the common case in one test (this runs on every call); the messages name the first
    # argument that differs, dtypes before devices
    if not (act.dtype == dtype and weight.dtype == dtype and act.device == device
            and weight.device == device and bias is None):
        named = [("act", act), ("weight", weight)] + ([("bias", bias)] if bias is not None
                                                      else [])
        for name, t in named:
            if t.dtype != dtype:
                raise TypeError(
                    f"estimator: {name} must have the same dtype as x ({dtype}), got {t.dtype}")
        for name, t in named:
            if t.device != device:
                raise ValueError(f"estimator: {name} must be on the same device as x "
                                 f"({device}), got {t.device}")

    batch, inputs = x.shape
    outputs, w_inputs, paths = weight.shape
    if act.shape[0] != batch:
        raise ValueError(
            f"estimator: act must have B = {batch} rows like x (act [B, P]), "
            f"got act of shape {list(act.shape)}")
    if w_inputs != inputs:
        raise ValueError(
            f"estimator: weight [O, I, P] must have I = {inputs} (x.shape[1]), "
            f"got weight of shape {list(weight.shape)}")
    if paths != act.shape[1]:
        raise ValueError(
            f"estimator: weight [O, I, P] must have P = {act.shape[1]} (act.shape[1]), "
            f"got weight of shape {list(weight.shape)}")
    if bias is not None and bias.shape[0] != outputs:
        raise ValueError(
            f"estimator: bias must have shape [O] = [{outputs}] (weight.shape[0]), "
            f"got {list(bias.shape)}")
    return Shape(batch, inputs, paths, outputs)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs accumulate in float32 (docs/ARCHITECTURE.md §1); others in their own
    dtype."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def bias_gradient(dy: torch.Tensor) -> torch.Tensor:
    """dbias [O] = sum over b of dy [B, O], accumulated as the op accumulates, in dy's dtype."""
    return dy.sum(0, dtype=accumulation_dtype(dy.dtype)).to(dy.dtype)
