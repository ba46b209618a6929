"""Which backends and devices the suite runs on.

Every registered backend runs on every device it declares; a device this machine lacks
(CUDA here) or a backend unavailable on it is skipped with the registry's reason, so the
same command runs everything on a GPU machine. `GLAI_BACKEND=name pytest correctness/`
restricts the backend-parametrised tests to that backend.

Triton's interpreter must be chosen before any `@triton.jit` module is imported, so on a
machine without CUDA this file turns it on before glai_kernels is imported.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# Triton's interpreter runs tl.dot through numpy, whose OpenBLAS threads spin against
# torch's on a small shared machine: measured here, the triton backend's share of the suite
# took 93 s with them and 41 s with one. Set before torch imports numpy; torch's own BLAS
# (MKL on x86) is not affected.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest

import glai_kernels
from glai_kernels import registry

DEVICES = ("cpu", "cuda")
FUZZ_SEED_VAR = "GLAI_FUZZ_SEED"


def fuzz_seed() -> int:
    """The property tests' seed: $GLAI_FUZZ_SEED, else a new one for this run, stored in the
    environment so that every import of this file (and every subprocess) sees the same one."""
    if not os.environ.get(FUZZ_SEED_VAR):
        os.environ[FUZZ_SEED_VAR] = str(secrets.randbelow(2**32))
    return int(os.environ[FUZZ_SEED_VAR])


def pytest_report_header(config) -> str:
    return (f"fuzz seed: {FUZZ_SEED_VAR}={fuzz_seed()} (set it to replay this run's "
            f"correctness/test_properties.py cases)")


def backends_under_test() -> list[str]:
    chosen = os.environ.get(registry.ENV_VAR)
    if chosen and chosen != registry.AUTO:
        registry.get(chosen)  # an unknown name fails loudly, listing the registered ones
        return [chosen]
    return [s.name for s in glai_kernels.backends()]


def backend_device_params() -> list:
    params = []
    for name in backends_under_test():
        backend = registry.get(name)
        for device in DEVICES:
            if device not in backend.devices:
                continue
            reason = backend.unsupported_reason(device)
            marks = [pytest.mark.skip(reason=f"{name} on {device}: {reason}")] if reason else []
            if device == "cuda":
                marks.append(pytest.mark.cuda)
            params.append(pytest.param((name, device), id=f"{name}-{device}", marks=marks))
    return params


@pytest.fixture(params=backend_device_params())
def backend_device(request) -> tuple[str, str]:
    """(backend name, device) for every available pair."""
    return request.param


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on a CUDA device")
    config.addinivalue_line("markers", "slow: a long case (the paper's large heads)")


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test, restored after."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)
