"""The backends the correctness suite parametrises over: every registered one, or only
$GLAI_BACKEND's (`GLAI_BACKEND=name pytest correctness/`). A module of its own so tests can
import it (`conftest` is ambiguous as a module name: the repository root has one too)."""

from __future__ import annotations

import os

import pytest

import glai_kernels
from glai_kernels import registry


def backends_under_test() -> list[str]:
    chosen = os.environ.get(registry.ENV_VAR)
    if chosen and chosen != registry.AUTO:
        registry.get(chosen)  # an unknown name fails loudly, listing the registered ones
        return [chosen]
    return [s.name for s in glai_kernels.backends()]


def backend_param(name: str, backend, device: str):
    """The pytest.param ((name, device)) of one backend on one device: skipped with the
    backend's own reason where it cannot run there, marked `cuda` on CUDA."""
    reason = backend.unsupported_reason(device)
    marks = [pytest.mark.skip(reason=f"{name} on {device}: {reason}")] if reason else []
    if device == "cuda":
        marks.append(pytest.mark.cuda)
    return pytest.param((name, device), id=f"{name}-{device}", marks=marks)
