"""Build a CUDA source as a CPU shared library against the emulation in cuda_emulation/.

Both emulated suites (test_cuda_emulated.py, test_sparse_cuda_emulated.py) build this way;
a toolchain without a C++20 compiler, <ucontext.h> or _Float16 skips them, it does not fail.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parent / "cuda_emulation"


def build_emulated(source: Path, work: Path, name: str) -> ctypes.CDLL:
    """Compile `source` (a .cu file) with -DGLAI_CUDA_EMULATION into work/lib<name>.so and
    load it; pytest.skip when the toolchain cannot, an assertion with the compiler's
    message when the source does not compile."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the emulated kernels")
    probe = work / "probe.cpp"
    probe.write_text("#include <ucontext.h>\nint main() { ucontext_t c; getcontext(&c);"
                     " _Float16 h = 1; return static_cast<int>(h) - 1; }\n")
    if subprocess.run([compiler, "-std=c++20", str(probe), "-o", str(work / "probe")],
                      capture_output=True).returncode != 0:
        pytest.skip(f"{compiler} lacks <ucontext.h> or _Float16, which the emulation uses")
    library = work / f"lib{name}.so"
    done = subprocess.run(
        [compiler, "-std=c++20", "-O1", "-fPIC", "-shared", "-Wall", "-DGLAI_CUDA_EMULATION",
         f"-I{EMULATION}", "-x", "c++", str(source), "-o", str(library)],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return ctypes.CDLL(str(library))
