"""The dense CUDA kernels built against the CPU emulation, and their C interface from Python.

A non-test module so that more than one test file can load estimator_kernels.cu the same way
(test files may not import each other: test_import_graph.py). `load` builds a source (the .cu,
or a wrapper that defines a planted bug and includes it) and declares the C functions;
`products` runs the four products through glai_cuda_launch exactly as the binding does;
`oracle` gives the float64 results and the absolute-sum scales the tolerances apply to.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch
from emulated_build import build_emulated

from reference import abs_forward64, abs_grads64, forward64, grads64

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "glai_kernels" / "csrc" / "cuda" / "estimator_kernels.cu"

# the kernels' dtype codes (estimator_kernels.cuh's glai_dtype), not a list of dtypes
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
PRODUCTS = {"y": 0, "dx": 1, "dact": 2, "dweight": 3}
# each product's key in the oracle's dicts (forward64's "y", grads64's fields)
OUT_KEYS = {"y": "y", "dx": "x", "dact": "act", "dweight": "weight"}


class Problem(ctypes.Structure):
    """estimator_kernels.cuh's glai_problem."""

    _fields_ = [("x", ctypes.c_void_p), ("act", ctypes.c_void_p), ("weight", ctypes.c_void_p),
                ("dy", ctypes.c_void_p), ("batch", ctypes.c_int64), ("inputs", ctypes.c_int64),
                ("paths", ctypes.c_int64), ("outputs", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("allow_tf32", ctypes.c_int)]


def load(source: Path, work: Path, name: str) -> ctypes.CDLL:
    """Build `source` against the emulation into `work` and declare its C functions."""
    lib = build_emulated(source, work, name)
    lib.glai_cuda_workspace_elements.restype = ctypes.c_int64
    lib.glai_cuda_workspace_elements.argtypes = [ctypes.POINTER(Problem), ctypes.c_int,
                                                 ctypes.c_int]
    lib.glai_cuda_launch.restype = ctypes.c_int
    lib.glai_cuda_launch.argtypes = [ctypes.POINTER(Problem), ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.glai_emulation_set_compute_capability.argtypes = [ctypes.c_int]
    lib.glai_emulation_set_async_copies.argtypes = [ctypes.c_int]
    return lib


def run(lib: ctypes.CDLL, problem: Problem, product: str, splits: int,
        shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """One product, `splits` blocks along its reduction; output and workspace start as NaN so
    an element never written shows."""
    out = torch.full(shape, float("nan"), dtype=dtype)
    count = lib.glai_cuda_workspace_elements(ctypes.byref(problem), PRODUCTS[product], splits)
    workspace = torch.full((max(count, 1),), float("nan"),
                           dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    status = lib.glai_cuda_launch(ctypes.byref(problem), PRODUCTS[product], splits,
                                  out.data_ptr(), workspace.data_ptr() if count else None, None)
    assert status == 0, f"launch returned cudaError {status}"
    return out


def products(lib: ctypes.CDLL, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
             dy: torch.Tensor, splits: int | Callable[[str], int],
             names: tuple[str, ...] = tuple(PRODUCTS)) -> dict[str, torch.Tensor]:
    """The emulated products of x [B, I], act [B, P], weight [O, I, P], dy [B, O] (one
    contiguous dtype), shaped as the oracle's (dweight [O, I, P])."""
    batch, inputs = x.shape
    outputs, _, paths = weight.shape
    problem = Problem(x.data_ptr(), act.data_ptr(), weight.data_ptr(), dy.data_ptr(), batch,
                      inputs, paths, outputs, DTYPE_CODES[x.dtype], 0)
    shapes = {"y": (batch, outputs), "dx": (batch, inputs), "dact": (batch, paths),
              "dweight": (outputs, inputs, paths)}
    return {name: run(lib, problem, name, splits(name) if callable(splits) else splits,
                      shapes[name], x.dtype) for name in names}


def oracle(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
           dy: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The float64 products and their absolute-sum scales, keyed as OUT_KEYS' values."""
    x64, act64, w64, dy64 = (t.double() for t in (x, act, weight, dy))
    expected = {"y": forward64(x64, act64, w64), **grads64(dy64, x64, act64, w64)._asdict()}
    scale = {"y": abs_forward64(x64, act64, w64), **abs_grads64(dy64, x64, act64, w64)._asdict()}
    return expected, scale
