"""The backends the correctness suite parametrises over: every registered one, or only
$GLAI_BACKEND's (`GLAI_BACKEND=name pytest correctness/`). A module of its own so tests can
import it (`conftest` is ambiguous as a module name: the repository root has one too)."""

from __future__ import annotations

import os

import glai_kernels
from glai_kernels import registry


def backends_under_test() -> list[str]:
    chosen = os.environ.get(registry.ENV_VAR)
    if chosen and chosen != registry.AUTO:
        registry.get(chosen)  # an unknown name fails loudly, listing the registered ones
        return [chosen]
    return [s.name for s in glai_kernels.backends()]
