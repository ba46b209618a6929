"""The glai_ext extension's build (glai_kernels/extension_build.py): its cache, a second
process loading it, the errors when it cannot build, the remembered failure and when it is
retried, and the CUDA part failing alone. What its ops compute is in
correctness/test_extension_kernels.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import glai_kernels
from glai_kernels import extension_build

ROOT = Path(__file__).resolve().parent.parent


def _run_python(code: str, env_update: dict[str, str], timeout: float = 300) -> str:
    """Run `code` in a fresh interpreter from the repository root; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_update}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# a fresh process that reports the cpp backend's availability and proves the others still run
REPORT = """
    import torch, glai_kernels
    from glai_kernels import registry
    x, act, w = torch.randn(3, 4), torch.rand(3, 5), torch.randn(2, 4, 5)
    y = glai_kernels.estimator(x, act, w, backend="torch")
    assert y.shape == (3, 2)
    status = {s.name: s for s in glai_kernels.backends()}
    assert not status["cpp"].available
    assert registry.pick_auto("cpu", torch.float32).name != "cpp"
    print("REASON:", status["cpp"].devices["cpu"])
"""


# ---- build and cache ---------------------------------------------------------------------

def test_second_process_loads_the_cached_build(built):
    library = built.library
    before = library.stat().st_mtime_ns
    out = _run_python("""
        import time
        from glai_kernels import extension_build
        start = time.perf_counter()
        result = extension_build.build()
        print("ERROR:", result.error)
        print("DIR:", result.directory)
        print("SECONDS:", time.perf_counter() - start)
    """, {})
    assert "ERROR: None" in out
    assert f"DIR: {built.directory}" in out
    assert library.stat().st_mtime_ns == before, "the second load rebuilt the library"
    seconds = float(re.search(r"SECONDS: (\S+)", out).group(1))
    assert seconds < 10, f"loading the cached build took {seconds:.1f} s"


def test_cache_directory_names_torch_version_and_source_hash(built):
    if built.ahead_of_time:
        pytest.skip("glai_kernels._C is installed: the JIT cache is not used")
    assert built.directory.parent == extension_build.cache_root()
    assert built.directory.name == (
        f"{torch.__version__}-{extension_build.cache_key(with_cuda=built.with_cuda)}")


def test_every_source_compiles_to_its_own_object_file():
    """torch's JIT build names each object after its source's file name alone (a .cu file
    gets .cuda.o), whatever its folder: two sources of one name make ninja refuse the whole
    CUDA build, as a real GPU machine's first build did."""
    objects = [s.stem + (".cuda.o" if s.suffix == ".cu" else ".o")
               for s in extension_build.cpu_sources() + extension_build.cuda_sources()]
    assert len(extension_build.cuda_sources()) >= 4
    assert len(set(objects)) == len(objects), sorted(objects)


def test_cache_key_follows_the_sources(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(extension_build.CSRC, copy)
    assert extension_build.cache_key(copy) == extension_build.cache_key()
    kernels = copy / "cpu" / "kernels.inc"
    kernels.write_text(kernels.read_text() + "\n// changed\n")
    assert extension_build.cache_key(copy) != extension_build.cache_key()
    assert extension_build.cache_key(with_cuda=True) != extension_build.cache_key(with_cuda=False)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(extension_build.CACHE_ENV, str(tmp_path / "here"))
    assert extension_build.cache_root() == tmp_path / "here"
    monkeypatch.delenv(extension_build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert extension_build.cache_root() == tmp_path / "xdg" / "glai_kernels"


# ---- a build that cannot happen, or fails ----------------------------------------------

def test_missing_compiler_is_reported_and_others_keep_working(tmp_path):
    out = _run_python(REPORT, {"CXX": "/nonexistent/c++",
                               extension_build.CACHE_ENV: str(tmp_path / "cache")})
    assert "no C++ compiler" in out and "/nonexistent/c++" in out, out


def test_missing_ninja_is_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    compiler = shutil.which(extension_build.cxx_compiler())
    if compiler is None:
        pytest.skip("no C++ compiler here to keep on PATH")
    (bin_dir / "c++").symlink_to(compiler)
    out = _run_python(REPORT, {"PATH": str(bin_dir), "CXX": "c++",
                               extension_build.CACHE_ENV: str(tmp_path / "cache")})
    assert "ninja is not installed" in out, out


def test_failing_compiler_is_reported(tmp_path):
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        pytest.skip("ninja is needed to reach the compile step")
    compiler = shutil.which(extension_build.cxx_compiler())
    if compiler is None:
        pytest.skip("no C++ compiler here to wrap")
    # answers torch's version probe, fails every compile step
    fake = tmp_path / "broken-c++"
    fake.write_text("#!/bin/sh\n"
                    'for arg in "$@"; do if [ "$arg" = "-c" ]; then\n'
                    "  echo 'error: simulated compiler failure' >&2; exit 1\n"
                    "fi; done\n"
                    f'exec {compiler} "$@"\n')
    fake.chmod(0o755)
    out = _run_python(REPORT, {"CXX": str(fake),
                               extension_build.CACHE_ENV: str(tmp_path / "cache")})
    assert "building the glai_ext extension failed" in out, out
    assert "simulated compiler failure" in out, out


def test_remembered_failure_is_retried_when_the_toolchain_changes(monkeypatch, tmp_path):
    seen = {"compiler": "/usr/bin/c++", "compiler_version": "c++ 12.2.0", "torch": "2.13",
            "sources": "0123"}
    monkeypatch.setattr(extension_build, "toolchain", lambda with_cuda: dict(seen))
    monkeypatch.delenv(extension_build.VERBOSE_ENV, raising=False)
    extension_build.remember_failure(tmp_path, False, "it failed")
    assert extension_build.remembered_failure(tmp_path, False) == "it failed"  # not retried
    monkeypatch.setenv(extension_build.VERBOSE_ENV, "1")  # asking to watch the build retries it
    assert extension_build.remembered_failure(tmp_path, False) is None
    monkeypatch.delenv(extension_build.VERBOSE_ENV)
    for part, changed in (("compiler_version", "c++ 13.1.0"), ("sources", "4567")):
        extension_build.remember_failure(tmp_path, False, "it failed")
        monkeypatch.setattr(extension_build, "toolchain",
                            lambda with_cuda, part=part, changed=changed: {**seen, part: changed})
        assert extension_build.remembered_failure(tmp_path, False) is None, part
        assert not list(tmp_path.glob("failed*")), "the stale record must go"
        monkeypatch.setattr(extension_build, "toolchain", lambda with_cuda: dict(seen))


def test_toolchain_names_compiler_nvcc_torch_and_sources():
    found = extension_build.toolchain(with_cuda=True)
    assert set(found) == {"compiler", "compiler_version", "nvcc", "nvcc_version", "torch",
                          "sources"}
    assert found["sources"] == extension_build.sources_hash()
    assert torch.__version__ in found["torch"]
    assert "nvcc" not in extension_build.toolchain(with_cuda=False)


def test_failed_build_says_where_its_log_is_and_retries_for_a_new_compiler(tmp_path):
    """A failing compiler: the first process fails and says where the log is; the next one
    with the same compiler reports the remembered failure without compiling; a compiler
    reporting a new version is tried again."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = shutil.which(extension_build.cxx_compiler())
    if not is_ninja_available() or compiler is None:
        pytest.skip("ninja and a C++ compiler are needed to reach the compile step")
    calls = tmp_path / "calls.log"
    fake = tmp_path / "broken-c++"

    def write_fake(version: str) -> None:
        fake.write_text("#!/bin/sh\n"
                        f'echo "$@" >> {calls}\n'
                        f'if [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\n'
                        'for arg in "$@"; do if [ "$arg" = "-c" ]; then\n'
                        "  echo 'error: simulated compiler failure' >&2; exit 1\n"
                        "fi; done\n"
                        f'exec {compiler} "$@"\n')
        fake.chmod(0o755)

    def compiles() -> int:
        return sum(" -c " in f" {line} " for line in calls.read_text().splitlines())

    env = {"CXX": str(fake), extension_build.CACHE_ENV: str(tmp_path / "cache"),
           extension_build.VERBOSE_ENV: ""}
    write_fake("fake c++ 1.0")
    first = _run_python(REPORT, env)
    assert "simulated compiler failure" in first, first
    log = re.search(r"the full log is (\S+build\.log)", first)
    assert log and "simulated compiler failure" in Path(log.group(1)).read_text(), first
    assert extension_build.VERBOSE_ENV in first, first
    tried = compiles()
    assert tried > 0
    second = _run_python(REPORT, env)
    assert "simulated compiler failure" in second, second
    assert compiles() == tried, "the same toolchain must not be tried again"
    write_fake("fake c++ 2.0")
    third = _run_python(REPORT, env)
    assert "simulated compiler failure" in third, third
    assert compiles() > tried, "a new compiler version must be tried"


def test_failed_cuda_build_leaves_cpp_working(built, tmp_path):
    """A CUDA part that does not compile: `cpp` still builds and works, `cuda` gives the
    reason, and the next process reads the remembered failure instead of rebuilding."""
    if built.with_cuda or built.ahead_of_time:
        pytest.skip("simulated where the CUDA part is not built, just in time, for real")
    cache = tmp_path / "cache"
    shutil.copytree(built.directory, cache / built.directory.name)  # the CPU part, built
    broken = tmp_path / "broken.cu"
    broken.write_text("#error simulated CUDA build failure\n")
    code = f"""
        import time
        from pathlib import Path
        from glai_kernels import extension_build as e
        e.cuda_build_reason = lambda: None  # as if torch had CUDA and nvcc were there
        e.cuda_sources = lambda: [Path({str(broken)!r})]
        start = time.perf_counter()
        result = e.build()
        print("ERROR:", result.error)
        print("WITH_CUDA:", result.with_cuda)
        print("CUDA:", result.cuda_reason)
        print("SECONDS:", time.perf_counter() - start)
        import torch, glai_kernels
        x, act, w = torch.randn(3, 4), torch.rand(3, 5), torch.randn(2, 4, 5)
        print("Y:", tuple(glai_kernels.estimator(x, act, w, backend="cpp").shape))
    """
    env = {extension_build.CACHE_ENV: str(cache), extension_build.VERBOSE_ENV: ""}
    first = _run_python(code, env)
    assert "ERROR: None" in first and "WITH_CUDA: False" in first, first
    assert "with CUDA failed" in first, first
    assert "Y: (3, 2)" in first, first
    second = _run_python(code, env)
    assert "with CUDA failed" in second and "Y: (3, 2)" in second, second
    assert float(re.search(r"SECONDS: (\S+)", second).group(1)) < 10, second


def test_cuda_backend_states_why_it_is_unavailable():
    reason = {s.name: s for s in glai_kernels.backends()}["cuda"].devices["cuda"]
    if torch.cuda.is_available() and extension_build.cuda_build_reason() is None:
        assert reason is None or "build" in reason
    else:
        assert reason, "the cuda backend must say why it cannot run"
