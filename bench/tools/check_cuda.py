"""Compile every CUDA source of the extension with nvcc for each target GPU and check ptxas.

    glai-bench check-cuda [--arch 80 --arch 90] [--report-dir reports/ptxas]
    (also `python -m bench check-cuda ...`, `nox -s cuda_check`)

For each architecture, every `glai_kernels/csrc/cuda/*.cu` is compiled to an object with
`-Xptxas -v` and the flags the JIT build uses (torch's half-operator defines, -O3). The run
fails (exit 1) on a compile error or on any kernel or device function that spills registers
(nonzero spill stores or loads). The per-kernel registers, shared memory, stack and spills
are written to `<report-dir>/sm_<arch>.md`, one table per architecture, for the record.

Then the torch bindings (every `cuda/*.cpp`) are compiled with `-fsyntax-only` against the
installed torch's headers, so a CPU-only machine still catches its errors; the CPU wheel
lacks one generated header (c10/cuda/impl/cuda_cmake_macros.h), which is stubbed.

Needs nvcc (CUDA 12 or 13) on PATH, in $CUDA_HOME/bin or /usr/local/cuda: no GPU, no CUDA
build of torch.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.cli_types import output_dir

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "glai_kernels" / "csrc" / "cuda"
DEFAULT_ARCHS = ("80", "90")
# what torch.utils.cpp_extension adds to every nvcc call (COMMON_NVCC_FLAGS), and ours
TORCH_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr")
FLAGS = ("-std=c++17", "-O3", "-lineinfo")


@dataclass
class Function:
    """ptxas's resource report for one kernel or device function."""

    name: str
    entry: bool = False
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


Item = TypeVar("Item")
Result = TypeVar("Result")


def on_every_core(compile_one: Callable[[Item], Result], items: Iterable[Item]) -> list[Result]:
    """`compile_one` of each item, in order, as many at once as there are cores: each call
    waits on a compiler process, and one at a time left CI's second core idle."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, min(len(items), os.cpu_count() or 1))) as pool:
        return list(pool.map(compile_one, items))


def find_nvcc() -> str | None:
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if c and Path(c).exists()), None)


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if tool is None or not names:
        return {n: n for n in names}
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = done.stdout.splitlines()
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {n: n for n in names}


def parse_ptxas(log: str) -> list[Function]:
    """Functions in ptxas -v output, in order: 'Compiling entry function', 'Function
    properties for' (stack and spills on the next line) and 'Used N registers' lines."""
    functions: dict[str, Function] = {}
    current: Function | None = None
    lines = log.splitlines()
    for n, line in enumerate(lines):
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            current = functions.setdefault(m.group(1), Function(m.group(1)))
            current.entry = True
        elif m := re.search(r"Function properties for (\S+)", line):
            current = functions.setdefault(m.group(1), Function(m.group(1)))
            following = lines[n + 1] if n + 1 < len(lines) else ""
            if s := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                              r"(\d+) bytes spill loads", following):
                current.stack_bytes, current.spill_stores, current.spill_loads = map(
                    int, s.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and current is not None:
            current.registers = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                current.shared_bytes = int(s.group(1))
    return list(functions.values())


def compile_source(nvcc: str, source: Path, arch: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, *FLAGS, *TORCH_NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}",
               "-Xptxas", "-v", "-c", str(source), "-o", str(Path(tmp) / "out.o")]
        done = subprocess.run(cmd, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def cuda_include_dir(nvcc: str) -> Path | None:
    """The CUDA toolkit's include directory (nvcc may be a wrapper script elsewhere)."""
    candidates = [Path(nvcc).resolve().parent.parent / "include"]
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_runtime.h").exists()), None)


def cuda_macros_stub(include_dirs: list[Path], folder: Path) -> list[str]:
    """The flag adding a stand-in for the header the CUDA build generates
    (c10/cuda/impl/cuda_cmake_macros.h), written under `folder`, when none of `include_dirs`
    has it (a CPU wheel's headers lack it); [] when one has."""
    generated = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if any((d / generated).exists() for d in include_dirs):
        return []
    (folder / generated).parent.mkdir(parents=True)
    (folder / generated).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    return [f"-isystem{folder}"]


def check_binding(nvcc: str, source: Path) -> str | None:
    """Compile a binding (cuda/*.cpp) with -fsyntax-only against torch's headers; the error
    or None."""
    try:
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return "torch is not importable"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler})"
    csrc = CUDA_DIR.parent
    cuda_include = cuda_include_dir(nvcc)
    if cuda_include is None:
        return "cuda_runtime.h not found next to nvcc, in $CUDA_HOME or /usr/local/cuda"
    with tempfile.TemporaryDirectory() as stub:
        includes = [f"-I{csrc}", f"-I{cuda_include}"]
        includes += [f"-isystem{p}" for p in include_paths()]
        includes += cuda_macros_stub([Path(p) for p in include_paths()], Path(stub))
        done = subprocess.run([compiler, "-std=c++20", "-fsyntax-only", "-Wall", *includes,
                               str(source)], capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr[-4000:]


def report(arch: str, nvcc_version: str, rows: list[tuple[str, Function]]) -> str:
    names = demangle([f.name for _, f in rows])
    lines = [f"# ptxas report, sm_{arch}", "",
             f"Generated by `glai-bench check-cuda` with {nvcc_version}; flags "
             f"`{' '.join(FLAGS + TORCH_NVCC_FLAGS)}`. A spill fails the check.", "",
             "| source | function | kind | registers | shared memory (B) | stack (B) "
             "| spill stores (B) | spill loads (B) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for source, f in rows:
        pretty = re.sub(r"\(anonymous namespace\)::", "", names[f.name]).replace("|", "\\|")
        lines.append(f"| {source} | `{pretty}` | {'kernel' if f.entry else 'device'} "
                     f"| {f.registers} | {f.shared_bytes} | {f.stack_bytes} "
                     f"| {f.spill_stores} | {f.spill_loads} |")
    return "\n".join(lines) + "\n"


def compute_capability(text: str) -> str:
    """An sm_XY number as nvcc takes it: two or three digits (80, 90, 100, 120a)."""
    if not re.fullmatch(r"\d{2,3}[af]?", text):
        raise argparse.ArgumentTypeError(f"must be a compute capability such as 80 or 90, "
                                         f"got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glai-bench check-cuda",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", type=compute_capability,
                        help="compute capability, e.g. 80")
    parser.add_argument("--report-dir", type=output_dir, default=ROOT / "reports" / "ptxas")
    args = parser.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found (set NVCC or CUDA_HOME, or put it on PATH)")
        return 1
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release [\d.]+, V[\d.]+", version)
    nvcc_version = f"nvcc {release.group(0)}" if release else "nvcc"
    sources = sorted(CUDA_DIR.glob("*.cu"))
    if not sources:
        print(f"no .cu sources under {CUDA_DIR}")
        return 1
    args.report_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    archs = list(args.arch or DEFAULT_ARCHS)
    jobs = [(arch, source) for arch in archs for source in sources]
    compiled = dict(zip(jobs, on_every_core(lambda job: compile_source(nvcc, job[1], job[0]),
                                            jobs), strict=True))
    for arch in archs:
        rows: list[tuple[str, Function]] = []
        for source in sources:
            rc, log = compiled[arch, source]
            if rc != 0:
                print(f"sm_{arch} {source.name}: compile error\n{log[-4000:]}")
                failed = True
                continue
            functions = parse_ptxas(log)
            if not any(f.entry for f in functions):
                print(f"sm_{arch} {source.name}: no kernels in the ptxas output")
                failed = True
            rows += [(source.name, f) for f in functions]
        spilling = [f for _, f in rows if f.spills]
        for f in spilling:
            print(f"sm_{arch}: {demangle([f.name])[f.name]} spills "
                  f"{f.spill_stores} B stored, {f.spill_loads} B loaded")
        failed |= bool(spilling)
        path = args.report_dir / f"sm_{arch}.md"
        path.write_text(report(arch, nvcc_version, rows))
        kernels = sum(f.entry for _, f in rows)
        print(f"sm_{arch}: {kernels} kernels, {len(spilling)} spilling -> "
              f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    bindings = sorted(CUDA_DIR.glob("*.cpp"))
    for binding, binding_error in zip(bindings, on_every_core(
            lambda source: check_binding(nvcc, source), bindings), strict=True):
        print(f"{binding.name}: " + ("compiles (syntax only)" if binding_error is None
                                     else f"FAILED\n{binding_error}"))
        failed |= binding_error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
