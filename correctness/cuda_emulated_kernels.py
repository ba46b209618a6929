"""The emulated CUDA estimator kernels through their C interface, for the emulated suites.

A non-test module so that more than one test file can load estimator_kernels.cu the same way
(test files may not import each other: test_import_graph.py). `load` builds
glai_kernels/csrc/cuda/estimator_kernels.cu (or a wrapper that defines a planted bug and
includes it) against correctness/cuda_emulation/ (emulated_build.py) and declares the C
functions of estimator_kernels.cuh; `products` runs them as the binding does (a workspace when
split), `oracle` gives the float64 results and the error scales they are measured on
(reference.tolerance). Every emulated suite of these kernels calls them through here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from emulated_build import build_emulated

from reference import abs_forward64, abs_grads64, forward64, grads64, make_inputs

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "glai_kernels" / "csrc" / "cuda" / "estimator_kernels.cu"

# the kernels' codes (estimator_kernels.cuh's glai_dtype and glai_product)
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
PRODUCTS = {"y": 0, "dx": 1, "dact": 2, "dweight": 3}
# the oracle's name of each product (grads64's fields)
ORACLE_KEYS = {"y": "y", "dx": "x", "dact": "act", "dweight": "weight"}


class Problem(ctypes.Structure):
    """estimator_kernels.cuh's glai_problem, field for field."""

    _fields_ = [("x", ctypes.c_void_p), ("act", ctypes.c_void_p), ("weight", ctypes.c_void_p),
                ("dy", ctypes.c_void_p), ("batch", ctypes.c_int64), ("inputs", ctypes.c_int64),
                ("paths", ctypes.c_int64), ("outputs", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("allow_tf32", ctypes.c_int)]


def load(work: Path, source: Path = SOURCE, name: str = "glai_cuda_emulated") -> ctypes.CDLL:
    """The emulated kernels of `source` built in `work` as library `name`, their C functions
    declared (pytest.skip where the toolchain cannot build them)."""
    lib = build_emulated(source, work, name)
    problem = ctypes.POINTER(Problem)
    lib.glai_cuda_splits.restype = ctypes.c_int
    lib.glai_cuda_splits.argtypes = [problem, ctypes.c_int, ctypes.c_int]
    lib.glai_cuda_workspace_elements.restype = ctypes.c_int64
    lib.glai_cuda_workspace_elements.argtypes = [problem, ctypes.c_int, ctypes.c_int]
    lib.glai_cuda_launch.restype = ctypes.c_int
    lib.glai_cuda_launch.argtypes = [problem, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p]
    lib.glai_emulation_set_compute_capability.argtypes = [ctypes.c_int]
    lib.glai_emulation_set_async_copies.argtypes = [ctypes.c_int]
    return lib


def sizes_problem(batch: int, inputs: int, paths: int, outputs: int,
                  dtype: torch.dtype = torch.float32, tf32: bool = False) -> Problem:
    """A problem without data, for glai_cuda_splits."""
    return Problem(None, None, None, None, batch, inputs, paths, outputs, DTYPE_CODES[dtype],
                   int(tf32))


def inputs(batch: int, inputs_: int, paths: int, outputs: int, dtype: torch.dtype,
           seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded x [B, I], soft gates act [B, P], weight [O, I, P] and dy [B, O]."""
    data = make_inputs(batch, inputs_, paths, outputs, dtype=dtype, seed=seed, gates="soft")
    dy = torch.randn(batch, outputs, generator=torch.Generator().manual_seed(seed + 1))
    return data.x, data.act, data.weight, dy.to(dtype)


def products(lib: ctypes.CDLL, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
             dy: torch.Tensor, splits: int | Callable[[str], int],
             names: Iterable[str] = tuple(PRODUCTS), tf32: bool = False
             ) -> dict[str, torch.Tensor]:
    """The emulated kernels' products, shaped as the oracle's (dweight [O, I, P]); `splits` a
    count, or a function of the product's name. Outputs and workspace start as NaN, so an
    element nobody writes shows."""
    batch, inputs_ = x.shape
    outputs, _, paths = weight.shape
    problem = Problem(x.data_ptr(), act.data_ptr(), weight.data_ptr(), dy.data_ptr(), batch,
                      inputs_, paths, outputs, DTYPE_CODES[x.dtype], int(tf32))
    shapes = {"y": (batch, outputs), "dx": (batch, inputs_), "dact": (batch, paths),
              "dweight": (outputs, inputs_, paths)}
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    got = {}
    for name in names:
        count = splits(name) if callable(splits) else splits
        out = torch.full(shapes[name], float("nan"), dtype=x.dtype)
        elements = lib.glai_cuda_workspace_elements(ctypes.byref(problem), PRODUCTS[name], count)
        workspace = torch.full((max(elements, 1),), float("nan"), dtype=wide)
        status = lib.glai_cuda_launch(ctypes.byref(problem), PRODUCTS[name], count,
                                      out.data_ptr(), workspace.data_ptr() if elements else None,
                                      None)
        assert status == 0, f"{name}: launch returned cudaError {status}"
        got[name] = out
    return got


def oracle(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor
           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """float64 results and error scales, keyed by product name."""
    x64, act64, w64, dy64 = (t.double() for t in (x, act, weight, dy))
    expected = {"y": forward64(x64, act64, w64), **grads64(dy64, x64, act64, w64)._asdict()}
    scale = {"y": abs_forward64(x64, act64, w64), **abs_grads64(dy64, x64, act64, w64)._asdict()}
    return ({name: expected[key] for name, key in ORACLE_KEYS.items()},
            {name: scale[key] for name, key in ORACLE_KEYS.items()})
