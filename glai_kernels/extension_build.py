"""How this process gets the glai_ext C++/CUDA extension (glai_kernels/csrc) loaded: its
sources and flags, the ahead-of-time build, the just-in-time build and its cache, and the
record of a failed build. What its ops compute, their fakes and which backends they make
available are in `extension.py`; this module only builds and loads the library.

The library registers the ops `glai_ext::*` (schemas in csrc/schema.cpp) with a CPU
implementation (fused, cache-blocked, vectorised kernels, runtime-dispatched between
AVX-512, AVX2 and a portable build) and, when built with CUDA, a CUDA one.

`build()` gets the library once per process, the first time a backend's availability is
asked, never at `import glai_kernels`:
- ahead of time: `GLAI_KERNELS_BUILD=1 pip install --no-build-isolation .` builds it as
  `glai_kernels._C` (setup.py takes `setup_arguments()`: the sources and flags below). It is
  loaded when `_C.json` beside it says it was built from these sources for this torch, and
  with the CUDA part wherever one could be built here;
- just in time, otherwise: `torch.utils.cpp_extension.load` with ninja, into one directory
  per source hash and torch version under $GLAI_KERNELS_CACHE (default
  ~/.cache/glai_kernels), from which a second process loads it without compiling.

A JIT build that cannot happen (no compiler, no ninja) or fails makes the backends it
concerns unavailable with the reason; the others are unaffected. A failure is remembered in
its cache directory with the toolchain it failed with (compiler path and version, nvcc's,
torch's version, the sources' hash) and retried when any of them changes, when its record
(failed.json) is deleted, or with $GLAI_KERNELS_VERBOSE set; its full log is kept beside it
(build.log). The CUDA part failing leaves the CPU part built alone.

Environment: $GLAI_KERNELS_CACHE (the cache root), $GLAI_KERNELS_VERBOSE=1 (show the build
as it runs), $GLAI_KERNELS_CPU_ISA=avx512|avx2|portable (force the CPU kernels' instruction
set; the op `torch.ops.glai_ext.cpu_isa(name)` does the same at run time).

This module imports nothing from glai_kernels (only torch), so setup.py can load it by its
path without importing the package.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

EXTENSION_NAME = "glai_ext"
AOT_MODULE = "glai_kernels._C"
AOT_INFO = "_C.json"  # beside the built glai_kernels._C: what it was built from
CSRC = Path(__file__).resolve().parent / "csrc"
CACHE_ENV = "GLAI_KERNELS_CACHE"
VERBOSE_ENV = "GLAI_KERNELS_VERBOSE"
_BUILT_MARKER = "built.ok"
_FAILED_MARKER = "failed.json"  # a failed build's error and toolchain: retried when it changes
_LOG = "build.log"

# -ffp-contract=fast lets the vector-extension kernels use FMA (ISO C++ mode turns it off);
# -fno-math-errno lets a square root of vector lanes compile to one vector instruction instead
# of a scalar call per lane that may set errno (the sparse Adam update; nothing reads errno).
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno", "-Wall",
          "-Wno-unknown-pragmas")
# -fopenmp links libgomp.so.1 by soname; torch has already loaded its own libgomp.so.1, so the
# loader reuses it and torch.set_num_threads governs the kernels' threads (tested).
LDFLAGS = ("-fopenmp",)
CUDA_CFLAGS = ("-O3", "-lineinfo")


def cpu_sources() -> list[Path]:
    """The library's C++: the op schemas, the shared runtime (task pool, kept results, the
    eager autograd node), and the CPU bindings with the kernels they run."""
    return [CSRC / "schema.cpp", CSRC / "task_pool.cpp", CSRC / "gradient_cache.cpp",
            CSRC / "eager_autograd.cpp",
            CSRC / "cpu" / "cpu_dense_binding.cpp", CSRC / "cpu" / "cpu_dispatch.cpp",
            CSRC / "cpu" / "cpu_sparse_binding.cpp", CSRC / "cpu" / "sparse_kernels.cpp",
            CSRC / "cpu" / "engineered_steps.cpp",
            CSRC / "cpu" / "sparse_eager_autograd.cpp"]


def cuda_sources() -> list[Path]:
    """The CUDA part: the kernels (.cu, compiled by nvcc) and their bindings (.cpp). Every
    source's file name is unique across both lists: torch's JIT build names each object
    after it alone."""
    return [*sorted((CSRC / "cuda").glob("*.cu")), *sorted((CSRC / "cuda").glob("*.cpp"))]


def source_files(root: Path = CSRC) -> list[Path]:
    """Every file the build reads under `root`: sources and the headers they include."""
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.suffix in {".cpp", ".cu", ".h", ".cuh", ".inc"})


def sources_hash(root: Path = CSRC) -> str:
    """A hash of the bytes of every source under `root` (by relative path) and the flags."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    for flag in (*CFLAGS, *LDFLAGS, *CUDA_CFLAGS):
        h.update(flag.encode() + b"\0")
    return h.hexdigest()[:16]


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
    """A hash of everything that decides the built library: the sources and flags, the
    compiler, torch's version and CUDA build, and whether the CUDA part is included."""
    h = hashlib.sha256()
    for part in (sources_hash(root), cxx_compiler(), torch.__version__, str(torch.version.cuda),
                 str(with_cuda), sys.platform):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def build_directory(with_cuda: bool) -> Path:
    return cache_root() / f"{torch.__version__}-{cache_key(with_cuda=with_cuda)}"


def nvcc_path() -> str | None:
    """The nvcc a CUDA build would use: $CUDA_HOME/bin/nvcc, else the one on PATH."""
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
    if nvcc_path() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def missing_tools() -> str | None:
    """What the JIT build needs and this machine lacks, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = cxx_compiler()
    if shutil.which(compiler) is None:
        return (f"no C++ compiler: {compiler!r} ($CXX, default c++) is not on PATH; "
                "install g++ or set CXX")
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja); the extension builds with it"
    return None


# ---- the toolchain a failure is remembered with --------------------------------------------

def _version(program: str, last: bool = False) -> str:
    """The first (or last) line of `program --version`, "unknown" if it does not answer."""
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else "unknown"


def toolchain(with_cuda: bool) -> dict[str, str]:
    """What a build's outcome depends on beyond its cache directory's name: the compiler's
    resolved path and version, nvcc's (with CUDA), torch's version and the sources' hash."""
    compiler = shutil.which(cxx_compiler())
    found = {"compiler": str(Path(compiler).resolve()) if compiler else cxx_compiler(),
             "compiler_version": _version(compiler) if compiler else "missing",
             "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
             "sources": sources_hash()}
    if with_cuda:
        nvcc = nvcc_path()
        found["nvcc"] = nvcc or "missing"
        found["nvcc_version"] = _version(nvcc, last=True) if nvcc else "missing"
    return found


def remember_failure(directory: Path, with_cuda: bool, error: str) -> None:
    """Record that the build in `directory` failed with `error` under today's toolchain."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {"error": error, "toolchain": toolchain(with_cuda)}
    (directory / _FAILED_MARKER).write_text(json.dumps(record, indent=1) + "\n")


def remembered_failure(directory: Path, with_cuda: bool) -> str | None:
    """The error of an earlier failed build in `directory` while the toolchain is the one it
    failed with, else None; a record from another toolchain is removed, so the build runs.
    With $GLAI_KERNELS_VERBOSE set nothing is remembered: whoever asks to watch the build
    gets one."""
    marker = directory / _FAILED_MARKER
    if not marker.exists() or os.environ.get(VERBOSE_ENV):
        return None
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        record = {}
    if isinstance(record, dict) and record.get("toolchain") == toolchain(with_cuda):
        return str(record.get("error"))
    marker.unlink(missing_ok=True)
    return None


# ---- the ahead-of-time build (glai_kernels._C) ---------------------------------------------

def build_info(with_cuda: bool) -> dict[str, object]:
    """What an ahead-of-time build records in _C.json, and what a process needs it to say."""
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "sources": sources_hash(), "with_cuda": with_cuda}


def installed_library() -> tuple[Path | None, bool, str | None]:
    """(glai_kernels._C's path, whether it has the CUDA part, None) when it is installed and
    matches this process, else (None, False, why not)."""
    try:
        spec = importlib.util.find_spec(AOT_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return None, False, f"{AOT_MODULE} is not installed"
    library = Path(spec.origin)
    try:
        info = json.loads(library.with_name(AOT_INFO).read_text())
    except (OSError, ValueError):
        return None, False, f"{library} has no readable {AOT_INFO} beside it"
    with_cuda = bool(info.get("with_cuda"))
    if info != build_info(with_cuda):
        return None, False, f"{library} was built from other sources or for another torch"
    if not with_cuda and cuda_build_reason() is None:
        return None, False, f"{library} has no CUDA part, and one can be built here"
    return library, with_cuda, None


def setup_arguments(root: Path) -> dict[str, object]:
    """setup()'s ext_modules and cmdclass for building `glai_kernels._C` ahead of time: the
    JIT build's sources and flags, with the CUDA part when torch has CUDA and nvcc is found.
    `root` is the project directory; setuptools wants source paths relative to it."""
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    with_cuda = cuda_build_reason() is None
    sources = cpu_sources() + (cuda_sources() if with_cuda else [])
    # -g0 last: setuptools adds Python's own build flags, -g among them, which the JIT build
    # does not have; measured on the Intel Xeon, -g took engineered_steps.cpp's compile from
    # 14.4 to 24.8 s and its object from 0.38 to 9.2 MB (docs/notes/ci.md, "bench/tests beside
    # the correctness suite (stop 54)")
    flags: dict[str, list[str]] = {"cxx": [*CFLAGS, "-g0"]}
    if with_cuda:
        flags["nvcc"] = list(CUDA_CFLAGS)
    kind = CUDAExtension if with_cuda else CppExtension
    extension = kind(name=AOT_MODULE,
                     sources=[p.relative_to(root.resolve()).as_posix() for p in sources],
                     include_dirs=[str(CSRC)],
                     extra_compile_args=flags,
                     extra_link_args=list(LDFLAGS))
    info = build_info(with_cuda)

    class BuildWithInfo(BuildExtension):
        """BuildExtension that also writes _C.json beside the library it built."""

        def run(self) -> None:
            super().run()
            target = Path(self.get_ext_fullpath(AOT_MODULE)).with_name(AOT_INFO)
            target.write_text(json.dumps(info, indent=1) + "\n")

    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildWithInfo}}


# ---- the just-in-time build ----------------------------------------------------------------

@dataclass(frozen=True)
class Build:
    """The outcome of getting the extension loaded in this process: `error` is None when it
    is; `library` is the file loaded, `ahead_of_time` whether it is glai_kernels._C."""

    error: str | None
    with_cuda: bool = False
    cuda_reason: str | None = None
    directory: Path | None = None
    library: Path | None = None
    ahead_of_time: bool = False


def _summarise(error: BaseException) -> str:
    """The compiler's diagnostics from a failed build, not its whole log (the ninja log
    echoes every command line, which buries them)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    diagnostics = [ln for ln in lines if re.search(r"(error|undefined reference)\b.*:|: error",
                                                   ln, re.I)
                   and not ln.startswith("[") and "Error building extension" not in ln]
    detail = " | ".join(diagnostics[:3]) if diagnostics else (lines[-1] if lines else "")
    return f"{type(error).__name__}: {detail}"[:600]


def _library(directory: Path) -> Path:
    return directory / f"{EXTENSION_NAME}.so"


def _is_built(directory: Path) -> bool:
    return (directory / _BUILT_MARKER).exists() and _library(directory).exists()


def _load(library: Path) -> bool:
    """Load the library's ops into torch.ops.glai_ext (their fakes: extension.load())."""
    try:
        torch.ops.load_library(str(library))
    except OSError:
        return False
    return True


def _compile(with_cuda: bool) -> tuple[Path, str | None]:
    """Build and load the extension (with or without its CUDA part) in its cache directory,
    or load an earlier build from there; (directory, None) or (directory, what failed)."""
    directory = build_directory(with_cuda)
    if _is_built(directory) and _load(_library(directory)):
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
        log = directory / _LOG
        log.write_text(f"{error}\n")
        message = (f"building the glai_ext extension{' with CUDA' if with_cuda else ''} "
                   f"failed ({_summarise(error)}); the full log is {log}, or set "
                   f"{VERBOSE_ENV}=1 to watch the build; it is retried when the compiler, "
                   f"nvcc, torch or the sources change, or once {directory / _FAILED_MARKER} "
                   "is deleted")
        remember_failure(directory, with_cuda, message)
        return directory, message
    (directory / _BUILT_MARKER).write_text(f"{torch.__version__}\n")
    return directory, None


@functools.cache
def build() -> Build:
    """Load glai_kernels._C when it matches, else build (or load from the cache) the
    extension just in time, once per process.

    The CUDA part is included when torch has CUDA and nvcc exists; if that build fails, the
    CPU part is built alone, so `cpp` still works and `cuda` reports the failure."""
    library, with_cuda, _ = installed_library()
    if library is not None and _load(library):
        return Build(None, with_cuda, None if with_cuda else cuda_build_reason(),
                     library.parent, library, ahead_of_time=True)
    cuda_reason = cuda_build_reason()
    with_cuda = cuda_reason is None
    if with_cuda:
        failed = remembered_failure(build_directory(True), True)
        if failed is not None:
            cuda_reason, with_cuda = failed, False
    directory = build_directory(with_cuda)
    if not _is_built(directory):
        missing = missing_tools()
        if missing is not None:
            return Build(f"cannot build the glai_ext extension: {missing}", False, cuda_reason)
        failed = remembered_failure(directory, with_cuda)
        if failed is not None and not with_cuda:
            return Build(failed, False, cuda_reason, directory)
    directory, error = _compile(with_cuda)
    if error is not None and with_cuda:
        cuda_reason, with_cuda = error, False
        directory, error = _compile(False)
    return Build(error, with_cuda and error is None, cuda_reason, directory,
                 None if error else _library(directory))
