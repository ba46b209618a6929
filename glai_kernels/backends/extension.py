"""`cpp` and `cuda`: the glai_ext C++/CUDA extension (glai_kernels/csrc), built on first need.

One extension registers the ops `glai_ext::forward` and `glai_ext::backward` with a CPU
implementation (fused, cache-blocked, vectorised kernels, runtime-dispatched between AVX-512,
AVX2 and a portable build) and, when torch has CUDA and nvcc exists, a CUDA one (tiled
GEMMs forming the Khatri-Rao operand in shared memory, tensor cores for half types). `cpp`
keeps the forward's Z [B, O, P] when act needs a gradient (SPEC §2's Z-form), so dact costs
B*O*P instead of a GEMM; the CUDA kernels compute y in the one-GEMM form, which has no Z,
so `cuda` computes dact with a fourth GEMM.

The build is JIT (`torch.utils.cpp_extension.load` with ninja) and happens the first time a
backend's availability is asked, never at `import glai_kernels`. Its result is cached per
process; the built library is cached on disk per source hash and torch version under
$GLAI_KERNELS_CACHE (default ~/.cache/glai_kernels), so a second process loads it without
compiling. A build that cannot happen (no compiler, no ninja) or fails makes both backends
unavailable with the reason; the other backends are unaffected.

Environment: $GLAI_KERNELS_CACHE (the cache root), $GLAI_KERNELS_VERBOSE=1 (show the build
log), $GLAI_KERNELS_CPU_ISA=avx512|avx2|portable (force the CPU kernels' instruction set; the
op `torch.ops.glai_ext.cpu_isa(name)` does the same at run time).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from glai_kernels.contract import Shape
from glai_kernels.registry import Backend, device_present, register

EXTENSION_NAME = "glai_ext"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
CACHE_ENV = "GLAI_KERNELS_CACHE"
VERBOSE_ENV = "GLAI_KERNELS_VERBOSE"
_BUILT_MARKER = "built.ok"
_FAILED_MARKER = "failed.txt"  # a CUDA build that failed: not retried until the sources change

# -ffp-contract=fast lets the vector-extension kernels use FMA (ISO C++ mode turns it off).
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast", "-Wall", "-Wno-unknown-pragmas")
# -fopenmp links libgomp.so.1 by soname; torch has already loaded its own libgomp.so.1, so the
# loader reuses it and torch.set_num_threads governs the kernels' threads (tested).
LDFLAGS = ("-fopenmp",)
CUDA_CFLAGS = ("-O3", "-lineinfo")


def cpu_sources() -> list[Path]:
    return [CSRC / "glai_ext.cpp", CSRC / "cpu" / "cpu_dispatch.cpp",
            CSRC / "sparse_binding.cpp", CSRC / "cpu" / "sparse_kernels.cpp"]


def cuda_sources() -> list[Path]:
    return [*sorted((CSRC / "cuda").glob("*.cu")), CSRC / "cuda" / "binding.cpp"]


def source_files(root: Path = CSRC) -> list[Path]:
    """Every file the build reads under `root`: sources and the headers they include."""
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.suffix in {".cpp", ".cu", ".h", ".cuh", ".inc"})


def cache_root() -> Path:
    """$GLAI_KERNELS_CACHE, else $XDG_CACHE_HOME/glai_kernels, else ~/.cache/glai_kernels."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "glai_kernels"


def cxx_compiler() -> str:
    """The compiler torch.utils.cpp_extension will call: $CXX, else c++."""
    return os.environ.get("CXX", "c++")


def cache_key(root: Path = CSRC, with_cuda: bool = False) -> str:
    """A hash of everything that decides the built library: the bytes of every source under
    `root` (by relative path), the flags, the compiler, torch's version and CUDA build, and
    whether the CUDA part is included."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    for part in (*CFLAGS, *LDFLAGS, *CUDA_CFLAGS, cxx_compiler(), torch.__version__,
                 str(torch.version.cuda), str(with_cuda), sys.platform):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def build_directory(with_cuda: bool) -> Path:
    return cache_root() / f"{torch.__version__}-{cache_key(with_cuda=with_cuda)}"


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    candidates = [Path(CUDA_HOME) / "bin" / "nvcc"] if CUDA_HOME else []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    return next((str(c) for c in candidates if c.exists()), None)


def cuda_build_reason() -> str | None:
    """Why the CUDA kernels cannot be built here, or None (checked without building)."""
    if torch.version.cuda is None:
        return "this torch is a CPU-only build (torch.version.cuda is None)"
    if _nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def missing_tools() -> str | None:
    """What the build needs and this machine lacks, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = cxx_compiler()
    if shutil.which(compiler) is None:
        return (f"no C++ compiler: {compiler!r} ($CXX, default c++) is not on PATH; "
                "install g++ or set CXX")
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja); the extension builds with it"
    return None


@dataclass(frozen=True)
class Build:
    """The outcome of building and loading the extension in this process."""

    error: str | None
    with_cuda: bool = False
    cuda_reason: str | None = None
    directory: Path | None = None


def _summarise(error: BaseException) -> str:
    """The compiler's diagnostics from a failed build, not its whole log (the ninja log
    echoes every command line, which buries them)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    diagnostics = [ln for ln in lines if re.search(r"(error|undefined reference)\b.*:|: error",
                                                   ln, re.I)
                   and not ln.startswith("[") and "Error building extension" not in ln]
    detail = " | ".join(diagnostics[:3]) if diagnostics else (lines[-1] if lines else "")
    return f"{type(error).__name__}: {detail}"[:600]


def _is_built(directory: Path) -> bool:
    return (directory / _BUILT_MARKER).exists() and (directory / f"{EXTENSION_NAME}.so").exists()


def _load_built(directory: Path) -> bool:
    """Load a library built earlier in this cache directory, without calling ninja."""
    if not _is_built(directory):
        return False
    try:
        torch.ops.load_library(str(directory / f"{EXTENSION_NAME}.so"))
    except OSError:
        return False
    return True


def _compile(with_cuda: bool) -> tuple[Path, str | None]:
    """Build and load the extension (with or without its CUDA part) in its cache directory,
    or load an earlier build from there; (directory, None) or (directory, what failed)."""
    directory = build_directory(with_cuda)
    if _load_built(directory):
        return directory, None
    from torch.utils.cpp_extension import load

    sources = cpu_sources() + (cuda_sources() if with_cuda else [])
    directory.mkdir(parents=True, exist_ok=True)
    try:
        load(name=EXTENSION_NAME,
             sources=[str(s) for s in sources],
             extra_cflags=list(CFLAGS),
             extra_ldflags=list(LDFLAGS),
             extra_cuda_cflags=list(CUDA_CFLAGS),
             extra_include_paths=[str(CSRC)],
             build_directory=str(directory),
             is_python_module=False,
             verbose=bool(os.environ.get(VERBOSE_ENV)))
    except Exception as error:  # a failed build must not break the other backends
        return directory, (f"building the glai_ext extension{' with CUDA' if with_cuda else ''} "
                           f"failed ({_summarise(error)}); set {VERBOSE_ENV}=1 for the full log")
    (directory / _BUILT_MARKER).write_text(f"{torch.__version__}\n")
    return directory, None


@functools.cache
def build() -> Build:
    """Build (or load from the cache) and register the extension, once per process.

    The CUDA part is included when torch has CUDA and nvcc exists; if that build fails, the
    CPU part is built alone, so `cpp` still works and `cuda` reports the failure (remembered
    in the cache directory until the sources change)."""
    cuda_reason = cuda_build_reason()
    with_cuda = cuda_reason is None
    if with_cuda and (build_directory(True) / _FAILED_MARKER).exists():
        cuda_reason = (build_directory(True) / _FAILED_MARKER).read_text()
        with_cuda = False
    if not _is_built(build_directory(with_cuda)):
        missing = missing_tools()
        if missing is not None:
            return Build(f"cannot build the glai_ext extension: {missing}", False, cuda_reason)
    directory, error = _compile(with_cuda)
    if error is not None and with_cuda:
        (directory / _FAILED_MARKER).write_text(error)
        cuda_reason, with_cuda = error, False
        directory, error = _compile(False)
    return Build(error, with_cuda and error is None, cuda_reason, directory)


def cpp_availability(device_type: str) -> str | None:
    return build().error


def cuda_availability(device_type: str) -> str | None:
    reason = device_present(device_type) or cuda_build_reason()
    if reason is not None:
        return reason
    result = build()
    if result.error is not None:
        return result.error
    return None if result.with_cuda else result.cuda_reason


def ext_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
    return torch.ops.glai_ext.forward(x, act, weight, False)[0]


def ext_forward_saving(
    x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, O], Z [B, O, P]) with Z[b, o, s] = sum_i x[b, i] weight[o, i, s]."""
    y, z = torch.ops.glai_ext.forward(x, act, weight, True)
    return y, z


def ext_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), only those in `needs`;
    `saved` is the forward's Z, which makes dact cheap."""
    z = saved if saved is not None else dy.new_empty(0)
    grads = torch.ops.glai_ext.backward(dy, x, act, weight, z, *needs)
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))  # type: ignore[return-value]


def cpp_auto_priority() -> dict[str, int]:
    """Above `torch` (10) on CPUs with AVX2 or AVX-512, where the float32 kernels measured 1.4x
    and 3.3x its forward+backward (bench/NOTES.md; float64, float16 and, with AVX512_BF16,
    bfloat16 are faster too); below it elsewhere, where only the portable build runs (0.4x).
    Read from torch's CPU capability, so choosing needs no build."""
    capability = torch.backends.cpu.get_cpu_capability()
    return {"cpu": 20 if capability in ("AVX2", "AVX512") else 5}


def saved_z_shape(shape: Shape) -> tuple[int, int, int]:
    return (shape.batch, shape.outputs, shape.paths)


register(Backend(
    name="cpp",
    forward=ext_forward,
    backward=ext_backward,
    forward_saving=ext_forward_saving,
    saved_shape=saved_z_shape,
    devices=("cpu",),
    description="C++ extension: fused cache-blocked CPU kernels (AVX-512, AVX512_BF16, AVX2, "
                "portable)",
    auto_priority=cpp_auto_priority(),
    availability=cpp_availability,
))

register(Backend(
    name="cuda",
    forward=ext_forward,
    backward=ext_backward,
    devices=("cuda",),
    description="CUDA extension: tiled GEMMs, x⊗act formed in shared memory, tensor cores "
                "(wmma) for half types, split-K",
    auto_priority={"cuda": 20},
    availability=cuda_availability,
))
