"""The ahead-of-time build: `pip install .` stays pure Python unless GLAI_KERNELS_BUILD=1,
which builds the glai_ext extension into the wheel as glai_kernels._C; a process then loads
that library instead of building one just in time, as long as it matches.

The wheel builds take a copy of the packaging files into a temporary folder, so the
checkout gets no build/ or egg-info; `--no-index` keeps pip off the network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from glai_kernels import extension_build

ROOT = Path(__file__).resolve().parents[1]
BUILD_ENV = "GLAI_KERNELS_BUILD"


def _project_copy(tmp_path: Path) -> Path:
    """What `pip wheel` reads from the checkout, copied: packaging files and the packages."""
    src = tmp_path / "project"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    for package in ("glai_kernels", "reference"):
        if (ROOT / package).exists():
            shutil.copytree(ROOT / package, src / package,
                            ignore=shutil.ignore_patterns("__pycache__", "_C*.so", "_C.json"))
    return src


def _wheel(tmp_path: Path, build: bool) -> Path:
    pytest.importorskip("setuptools", reason="pip wheel --no-build-isolation needs setuptools")
    env = {k: v for k, v in os.environ.items() if k != BUILD_ENV}
    if build:
        env[BUILD_ENV] = "1"
    out = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps",
         "--no-build-isolation", "--disable-pip-version-check", "-w", str(out),
         str(_project_copy(tmp_path))],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    (wheel,) = out.glob("glai_kernels-*.whl")
    return wheel


def test_setup_without_the_variable_imports_no_torch():
    env = {k: v for k, v in os.environ.items() if k != BUILD_ENV}
    code = ("import runpy, sys; sys.argv = ['setup.py', '--name']; "
            "runpy.run_path('setup.py', run_name='__main__'); "
            "print('TORCH', 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "glai-kernels" in done.stdout and "TORCH False" in done.stdout, done.stdout


def test_plain_wheel_is_pure_python(tmp_path):
    wheel = _wheel(tmp_path, build=False)
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "glai_kernels/extension.py" in names
    assert not [n for n in names if n.endswith(".so") or n.endswith("_C.json")]


@pytest.mark.slow
def test_aot_wheel_carries_the_extension_and_is_loaded(tmp_path):
    """~1 minute: one compile of the CPU kernels (and the CUDA ones where nvcc is found)."""
    if extension_build.missing_tools() is not None:
        pytest.skip(f"cannot build here: {extension_build.missing_tools()}")
    wheel = _wheel(tmp_path, build=True)
    names = zipfile.ZipFile(wheel).namelist()
    libraries = [n for n in names if n.startswith("glai_kernels/_C") and n.endswith(".so")]
    assert libraries, names
    assert "glai_kernels/_C.json" in names
    # built with the JIT build's flags: no -g from Python's own (-g0), so no debug sections
    assert b".debug_info" not in zipfile.ZipFile(wheel).read(libraries[0])

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                           "--disable-pip-version-check", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cache = tmp_path / "jit-cache"
    code = textwrap.dedent("""
        import torch, glai_kernels
        from glai_kernels import extension_build
        result = extension_build.build()
        print("AOT:", result.ahead_of_time, "ERROR:", result.error)
        print("FROM:", result.library)
        x, act, w = torch.randn(3, 4), torch.rand(3, 5), torch.randn(2, 4, 5)
        torch.testing.assert_close(glai_kernels.estimator(x, act, w, backend="cpp"),
                                   glai_kernels.estimator(x, act, w, backend="einsum"))
        print("CPP OK")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           extension_build.CACHE_ENV: str(cache)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "AOT: True ERROR: None" in done.stdout and "CPP OK" in done.stdout, done.stdout
    assert f"FROM: {site}" in done.stdout, done.stdout
    assert not cache.exists(), "the installed library should have spared the JIT build"

    # built from other sources: not loaded (the JIT build would run instead)
    info = site / "glai_kernels" / extension_build.AOT_INFO
    info.write_text(json.dumps({**json.loads(info.read_text()), "sources": "other"}))
    check = ("from glai_kernels import extension_build; "
             "print('FOUND:', extension_build.installed_library())")
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FOUND: (None, False," in done.stdout and "other sources" in done.stdout, done.stdout
