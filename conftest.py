"""Loaded by pytest before any test directory's conftest or test module, whatever the
invocation (`pytest`, `pytest bench correctness`, `pytest correctness/test_triton.py`).

Triton's interpreter must be chosen before any `@triton.jit` function is defined, that is
before glai_kernels is imported (bench/tests/conftest.py imports it through
bench.harness.provenance); so on a machine without CUDA this file turns it on here, and the
Triton tests run under the interpreter instead of skipping.
"""

from __future__ import annotations

import os

# Triton's interpreter runs tl.dot through numpy, whose OpenBLAS threads spin against
# torch's on a small shared machine: measured here, the triton backend's share of the suite
# took 93 s with them and 41 s with one. Set before torch imports numpy; torch's own BLAS
# (MKL on x86) is not affected.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # after the environment above, on purpose

# a time budget and an on-disk failure log for runs in a short GPU lease (off unless asked)
pytest_plugins = ["bench.tools.lease_plugin"]

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
