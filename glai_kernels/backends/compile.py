"""`compile`: torch.compile (fullgraph) of the `torch` backend's formulation.

Compiled with dynamic shapes, so a new batch size reuses the compiled graph instead of
recompiling; one graph per (device, dtype, set of gradients needed). Not picked by auto:
the first call of each graph pays the compile.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil

import torch

from glai_kernels.backends.torch import (
    gemm_workspace,
    saved_z_shape,
    torch_backward,
    torch_forward,
    torch_forward_saving,
)
from glai_kernels.registry import Backend, device_present, register

# Sizes of 1 still specialise under dynamic shapes, and each dtype is its own graph, so one
# process comparing many shapes and dtypes needs more than dynamo's default 8 graphs per
# function; with fullgraph=True running out is an error, not a fallback.
_RECOMPILE_LIMIT = 64


@functools.cache
def _compiled(fn):
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)

    @functools.wraps(fn)
    def run(*args):
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            return compiled(*args)

    return run


def compile_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O], via the compiled graph."""
    return _compiled(torch_forward)(x, act, weight)


def compile_forward_saving(x, act, weight):
    """As compile_forward, also returning Z [O, B, P] for the backward."""
    return _compiled(torch_forward_saving)(x, act, weight)


def compile_backward(dy, x, act, weight, needs, saved=None):
    """dy [B, O] -> (dx, dact, dweight) via the compiled graph, only those in `needs`."""
    return _compiled(torch_backward)(dy, x, act, weight, tuple(needs), saved)


def _availability(device_type: str) -> str | None:
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton, which is not installed"
    if device_type == "cpu" and shutil.which("c++") is None and shutil.which("g++") is None:
        return "torch.compile on CPU needs a C++ compiler (c++ or g++) on PATH"
    return device_present(device_type)


register(Backend(
    name="compile",
    forward=compile_forward,
    backward=compile_backward,
    forward_saving=compile_forward_saving,
    saved_shape=saved_z_shape,
    workspace=gemm_workspace,  # the same tensors, unless inductor fuses some away
    devices=("cpu", "cuda"),
    description="torch.compile(fullgraph=True, dynamic=True) of the torch backend's GEMMs",
    availability=_availability,
))
