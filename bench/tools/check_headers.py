"""Compile the extension's C++ against another torch release's headers, without installing it.

    glai-bench check-headers                   # the oldest torch pyproject.toml admits
    glai-bench check-headers --torch 2.12.0
    glai-bench check-headers --include DIR     # a torch/include folder already unpacked

The package admits a range of torch releases, CI builds against one, and the extension's C++
reaches into torch's autograd internals, whose types change between releases: an autograd
node made with `c10::make_intrusive` built on torch 2.13 and broke the whole build on 2.11
(docs/notes/cuda.md, "An H100 lease"). This fetches the release's wheel (`pip download --no-deps`,
about 0.5 GB, kept in $GLAI_KERNELS_CACHE/wheels), unpacks only `torch/include`, and compiles
every CPU source and CUDA binding with `-fsyntax-only` and the JIT build's flags. Exit 1 on any
error, or when the wheel cannot be fetched (0 with `--skip-if-offline`, saying so). A CUDA
binding is skipped, saying so, where no CUDA toolkit headers are found.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from bench.cli_types import existing_dir
from bench.tools.check_cuda import cuda_include_dir, cuda_macros_stub, find_nvcc, on_every_core
from glai_kernels import extension_build

ROOT = Path(__file__).resolve().parents[2]
DEFINES = ("-DTORCH_EXTENSION_NAME=glai_ext", "-DTORCH_API_INCLUDE_EXTENSION_H")


def oldest_admitted() -> str:
    """The lower bound of pyproject.toml's torch requirement, as a release (2.11 -> 2.11.0)."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"torch>=([0-9.]+)', text)
    if found is None:
        raise SystemExit("check-headers: pyproject.toml names no torch>= lower bound")
    parts = found.group(1).split(".")
    return ".".join([*parts, "0", "0"][:3])


def unpack_headers(wheel: Path, out: Path) -> Path:
    """torch/include of `wheel`, unpacked under `out` (once); returns the include folder."""
    include = out / "torch" / "include"
    if not (include / "torch").is_dir():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(out, [n for n in zf.namelist() if n.startswith("torch/include/")])
    return include


def fetch_headers(version: str, cache: Path) -> Path:
    """torch/include of torch==`version` for this Python and platform, from its wheel."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"torch-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", f"torch=={version}", "-d", str(wheels)])
        found = sorted(wheels.glob(f"torch-{version}-*.whl"))
    if not found:
        raise FetchError(f"pip fetched no wheel of torch=={version} for this Python")
    return unpack_headers(found[0], cache / f"torch-{version}-headers")


class FetchError(RuntimeError):
    """The release's wheel could not be had (no network, no wheel for this Python)."""


def syntax_errors(source: Path, include: Path, cuda_include: Path | None = None,
                  compiler: str | None = None) -> str | None:
    """Compile `source` with -fsyntax-only against the torch headers in `include` (a
    torch/include folder), the CUDA toolkit's headers in `cuda_include` (if any) and the
    extension's flags; the compiler's errors, or None."""
    compiler = compiler or os.environ.get("CXX", "c++")
    flags = [f for f in extension_build.CFLAGS if f != "-O3"]  # no code is generated
    includes = [f"-I{extension_build.CSRC}", f"-isystem{include}",
                f"-isystem{include / 'torch' / 'csrc' / 'api' / 'include'}",
                f"-isystem{sysconfig.get_paths()['include']}"]
    if cuda_include is not None:
        includes.append(f"-isystem{cuda_include}")
    with tempfile.TemporaryDirectory() as stub:
        includes += cuda_macros_stub([include], Path(stub))
        done = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", *flags, *DEFINES,
                               *includes, str(source)], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stdout + done.stderr)[-4000:]


def sources() -> list[Path]:
    """The C++ the JIT build compiles with the host compiler: CPU sources, CUDA bindings."""
    bindings = [p for p in extension_build.cuda_sources() if p.suffix == ".cpp"]
    return extension_build.cpu_sources() + bindings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glai-bench check-headers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--torch", default=None,
                   help="the torch release to check against (default: pyproject's lower bound)")
    p.add_argument("--include", type=existing_dir, default=None,
                   help="a torch/include folder to use instead of fetching a wheel")
    p.add_argument("--skip-if-offline", action="store_true",
                   help="exit 0, saying so, when the wheel cannot be fetched (CI: a network "
                        "failure is not the code's)")
    args = p.parse_args(argv)
    if args.include is not None:
        include, label = args.include, str(args.include)
    else:
        version = args.torch or oldest_admitted()
        try:
            include = fetch_headers(version, extension_build.cache_root())
        except FetchError as error:
            print(f"check-headers: {error}")
            return 0 if args.skip_if_offline else 1
        label = f"torch {version}"
    nvcc = find_nvcc()
    cuda_include = cuda_include_dir(nvcc) if nvcc else None
    checked = []
    for source in sources():
        if "cuda" in source.parts and cuda_include is None:
            print(f"skipped {source.relative_to(ROOT)}: no CUDA toolkit headers")
        else:
            checked.append(source)
    errors = on_every_core(lambda source: syntax_errors(source, include, cuda_include), checked)
    failed = 0
    for source, error in zip(checked, errors, strict=True):
        name = source.relative_to(ROOT)
        print(f"{'ok' if error is None else 'FAILED'} {name} against {label}")
        if error is not None:
            failed += 1
            print(error)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
