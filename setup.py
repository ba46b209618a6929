"""Packaging beyond pyproject.toml: the opt-in ahead-of-time build of the glai_ext extension.

    pip install .                                               # pure Python: fast
    GLAI_KERNELS_BUILD=1 pip install --no-build-isolation .     # also builds glai_kernels._C

Without GLAI_KERNELS_BUILD=1 this file adds nothing and imports no torch, and the extension
is built just in time on first use instead. With it, the CPU kernels are built (and the CUDA
ones when torch has CUDA and nvcc is found) from glai_kernels/extension_build.py's sources and
flags, the JIT build's own. `--no-build-isolation` lets the build see the torch it compiles
against (with ninja and a C++ compiler), which must be the one installed beside it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
BUILD_ENV = "GLAI_KERNELS_BUILD"


def extension_arguments() -> dict:
    """setup()'s ext_modules and cmdclass when GLAI_KERNELS_BUILD=1, else nothing."""
    if os.environ.get(BUILD_ENV, "0") in ("", "0"):
        return {}
    # Loaded by its path: the build need not have the project on sys.path, and the module
    # imports only torch (importing the package would register every backend).
    spec = importlib.util.spec_from_file_location(
        "glai_kernels_extension_build", ROOT / "glai_kernels" / "extension_build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.setup_arguments(ROOT)


setup(**extension_arguments())
