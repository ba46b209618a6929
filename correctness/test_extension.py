"""What only the glai_ext extension (backends `cpp` and `cuda`) has: its build and its cache,
the errors when it cannot build, its threads, its instruction sets and its tile edges.

The rest of the suite already runs both backends against the oracle through the registry.
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
from checker import check

import glai_kernels
from glai_kernels.backends import extension
from reference import abs_grads64, grads64, make_inputs, tolerance
from reference.tolerance import worst_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built() -> extension.Build:
    result = extension.build()
    if result.error is not None:
        pytest.skip(f"the extension is unavailable here: {result.error}")
    return result


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
    library = built.directory / f"{extension.EXTENSION_NAME}.so"
    before = library.stat().st_mtime_ns
    out = _run_python("""
        import time
        from glai_kernels.backends import extension
        start = time.perf_counter()
        result = extension.build()
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
    assert built.directory.parent == extension.cache_root()
    assert built.directory.name == (
        f"{torch.__version__}-{extension.cache_key(with_cuda=built.with_cuda)}")


def test_cache_key_follows_the_sources(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(extension.CSRC, copy)
    assert extension.cache_key(copy) == extension.cache_key()
    kernels = copy / "cpu" / "kernels.inc"
    kernels.write_text(kernels.read_text() + "\n// changed\n")
    assert extension.cache_key(copy) != extension.cache_key()
    assert extension.cache_key(with_cuda=True) != extension.cache_key(with_cuda=False)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(extension.CACHE_ENV, str(tmp_path / "here"))
    assert extension.cache_root() == tmp_path / "here"
    monkeypatch.delenv(extension.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert extension.cache_root() == tmp_path / "xdg" / "glai_kernels"


# ---- a build that cannot happen, or fails ----------------------------------------------

def test_missing_compiler_is_reported_and_others_keep_working(tmp_path):
    out = _run_python(REPORT, {"CXX": "/nonexistent/c++",
                               extension.CACHE_ENV: str(tmp_path / "cache")})
    assert "no C++ compiler" in out and "/nonexistent/c++" in out, out


def test_missing_ninja_is_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    compiler = shutil.which(extension.cxx_compiler())
    if compiler is None:
        pytest.skip("no C++ compiler here to keep on PATH")
    (bin_dir / "c++").symlink_to(compiler)
    out = _run_python(REPORT, {"PATH": str(bin_dir), "CXX": "c++",
                               extension.CACHE_ENV: str(tmp_path / "cache")})
    assert "ninja is not installed" in out, out


def test_failing_compiler_is_reported(tmp_path):
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        pytest.skip("ninja is needed to reach the compile step")
    compiler = shutil.which(extension.cxx_compiler())
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
    out = _run_python(REPORT, {"CXX": str(fake), extension.CACHE_ENV: str(tmp_path / "cache")})
    assert "building the glai_ext extension failed" in out, out
    assert "simulated compiler failure" in out, out


def test_failed_cuda_build_leaves_cpp_working(built, tmp_path):
    """A CUDA part that does not compile: `cpp` still builds and works, `cuda` gives the
    reason, and the next process reads the remembered failure instead of rebuilding."""
    if built.with_cuda:
        pytest.skip("simulated where the CUDA part is not built for real")
    cache = tmp_path / "cache"
    shutil.copytree(built.directory, cache / built.directory.name)  # the CPU part, built
    broken = tmp_path / "broken.cu"
    broken.write_text("#error simulated CUDA build failure\n")
    code = f"""
        import time
        from pathlib import Path
        from glai_kernels.backends import extension as e
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
    env = {extension.CACHE_ENV: str(cache)}
    first = _run_python(code, env)
    assert "ERROR: None" in first and "WITH_CUDA: False" in first, first
    assert "with CUDA failed" in first, first
    assert "Y: (3, 2)" in first, first
    second = _run_python(code, env)
    assert "with CUDA failed" in second and "Y: (3, 2)" in second, second
    assert float(re.search(r"SECONDS: (\S+)", second).group(1)) < 10, second


def test_cuda_backend_states_why_it_is_unavailable():
    reason = {s.name: s for s in glai_kernels.backends()}["cuda"].devices["cuda"]
    if torch.cuda.is_available() and extension.cuda_build_reason() is None:
        assert reason is None or "build" in reason
    else:
        assert reason, "the cuda backend must say why it cannot run"


# ---- threads -------------------------------------------------------------------------------

@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_threads_follow_torch_set_num_threads(built, restore_threads):
    torch.set_num_threads(1)
    assert torch.ops.glai_ext.parallel_threads(64) == 1
    torch.set_num_threads(2)
    assert torch.ops.glai_ext.parallel_threads(64) == 2


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_one_openmp_runtime_is_loaded(built):
    maps = Path("/proc/self/maps").read_text()
    runtimes = {Path(p).resolve() for p in re.findall(r"(/\S*lib[gi]omp[^/\s]*\.so\S*)", maps)}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_results_do_not_depend_on_the_thread_count(built, restore_threads, dtype):
    data = make_inputs(50, 23, 70, 9, seed=7, dtype=dtype)
    dy = torch.randn(50, 9, generator=torch.Generator().manual_seed(8)).to(dtype)

    def run():
        y, z = extension.ext_forward_saving(data.x, data.act, data.weight)
        grads = extension.ext_backward(dy, data.x, data.act, data.weight, (True, True, True),
                                       saved=z)
        recomputed = extension.ext_backward(dy, data.x, data.act, data.weight,
                                            (False, True, False))
        return [y, z, *grads, recomputed[1]]

    torch.set_num_threads(1)
    one = run()
    torch.set_num_threads(2)
    for a, b in zip(one, run(), strict=True):
        assert torch.equal(a, b)


# ---- instruction sets and tile edges -------------------------------------------------------

def _isas() -> list[str]:
    if extension.build().error is not None:
        return ["unavailable"]
    return ["avx512", "avx2", "portable"]


@pytest.fixture(params=_isas())
def isa(request, built):
    previous = torch.ops.glai_ext.cpu_isa()
    try:
        torch.ops.glai_ext.cpu_isa(request.param)
    except RuntimeError as error:
        pytest.skip(str(error))
    yield request.param
    torch.ops.glai_ext.cpu_isa(previous)


def test_unknown_isa_is_refused(built):
    with pytest.raises(RuntimeError, match="supports"):
        torch.ops.glai_ext.cpu_isa("sse1")


def _cpp(x, act, weight, bias):
    return glai_kernels.estimator(x, act, weight, bias, backend="cpp")


# Tiles: 6 rows; 64 float32 / 32 float64 columns (AVX-512), 16 / 8 (AVX2), 8 / 4 (portable),
# in vectors of 16 / 8, 8 / 4, 4 / 2. Sizes one below, at and one above those edges; odd
# sizes for bfloat16, whose AVX512_BF16 kernels take the reduction index in pairs (on the
# other instruction sets bfloat16 runs the float kernels).
EDGE_SHAPES = [
    (5, 6, 15, 2), (6, 7, 16, 1), (7, 5, 17, 3),
    (12, 11, 31, 2), (13, 13, 33, 2), (65, 12, 63, 2),
    (64, 6, 64, 1), (63, 7, 65, 2), (3, 19, 129, 4), (129, 5, 8, 3),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tile_edges_match_oracle(isa, shape, dtype):
    failures = check(_cpp, *shape, dtype=dtype, seed=sum(shape))
    assert not failures, "; ".join(map(str, failures))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_dact_without_saved_z_matches_oracle(built, dtype):
    """The op always keeps Z when act needs a gradient; the recomputing path is checked here."""
    data = make_inputs(37, 13, 70, 5, dtype=dtype, seed=9)
    dy = torch.randn(37, 5, generator=torch.Generator().manual_seed(10)).to(dtype)
    _, dact, _ = extension.ext_backward(dy, data.x, data.act, data.weight, (False, True, False))
    args = [t.double() for t in (dy, data.x, data.act, data.weight)]
    error = worst_error(dact, grads64(*args).act, abs_grads64(*args).act)
    assert error <= tolerance(dtype), error


def test_op_rejects_inconsistent_shapes(built):
    x, act, w = torch.randn(3, 4), torch.randn(3, 5), torch.randn(2, 4, 6)
    with pytest.raises(RuntimeError, match=r"weight must be \[O, 4, 5\]"):
        torch.ops.glai_ext.forward(x, act, w, False)
    with pytest.raises(RuntimeError, match=r"dy must be \[3, 2\]"):
        torch.ops.glai_ext.backward(torch.randn(3, 3), x, act, torch.randn(2, 4, 5),
                                    torch.empty(0), True, True, True)
