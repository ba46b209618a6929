"""A new contributor's backend is one file: written into glai_kernels/backends/ (the dense op)
or glai_kernels/sparse/backends/ (the sparse op), it is run by the correctness suite and timed
by the benchmark suite with no other edit.

The file goes into a copy of the repository's source tree, never the tree the suite runs
from (other pytest-xdist workers import the package from it at the same time), and everything
that must discover it runs in a fresh process from the copy, as a contributor's `pytest` and
`glai-bench run` (`python -m bench run`) would.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "toy"
MODULE = "toy_new_contributor"

TOY = textwrap.dedent(f'''
    """`{NAME}`: a contributor's backend (written and removed by correctness/test_new_backend.py).

    The op in float64 einsums, rounded to the inputs' dtype: slow and exact.
    """

    import torch

    from glai_kernels.registry import Backend, register


    def {NAME}_forward(x, act, weight):
        """x [B, I], act [B, P], weight [O, I, P] -> y [B, O]."""
        y = torch.einsum("bi,bs,ois->bo", x.double(), act.double(), weight.double())
        return y.to(x.dtype)


    def {NAME}_backward(dy, x, act, weight, needs, saved=None):
        """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), those in `needs`."""
        d, x64, a64, w64 = (t.double() for t in (dy, x, act, weight))
        need_x, need_act, need_weight = needs
        dx = torch.einsum("bo,bs,ois->bi", d, a64, w64).to(x.dtype) if need_x else None
        dact = torch.einsum("bo,bi,ois->bs", d, x64, w64).to(x.dtype) if need_act else None
        dw = torch.einsum("bo,bi,bs->ois", d, x64, a64).to(x.dtype) if need_weight else None
        return dx, dact, dw


    register(Backend(
        name="{NAME}",
        forward={NAME}_forward,
        backward={NAME}_backward,
        devices=("cpu",),
        description="a new contributor's backend (a test's)",
    ))
''')


SPARSE_NAME = "toysparse"
SPARSE_MODULE = "toysparse_new_contributor"

SPARSE_TOY = textwrap.dedent(f'''
    """`{SPARSE_NAME}`: a contributor's sparse backend (written by correctness/test_new_backend.py).

    The sparse op's float64 reference formulas, rounded to the inputs' dtype.
    """

    from glai_kernels.registry import Backend
    from glai_kernels.sparse.reference import backward64, forward64
    from glai_kernels.sparse.registry import SPARSE_ESTIMATOR


    def {SPARSE_NAME}_forward(x, act, values, index):
        """x [B, I], act [B, P], values [K] over `index` -> y [B, O]."""
        return forward64(x, act, values, index).to(x.dtype)


    def {SPARSE_NAME}_backward(dy, x, act, values, index, needs, saved=None):
        """dy [B, O] -> (dx [B, I], dact [B, P], dvalues [K]), those in `needs`."""
        grads = backward64(dy, x, act, values, index)
        return tuple(g.to(x.dtype) if need else None for g, need in zip(grads, needs))


    SPARSE_ESTIMATOR.register(Backend(
        name="{SPARSE_NAME}",
        forward={SPARSE_NAME}_forward,
        backward={SPARSE_NAME}_backward,
        devices=("cpu",),
        description="a new contributor's sparse backend (a test's)",
    ))
''')


# what the copy leaves out: history, reports and build outputs no test here reads
NOT_COPIED = shutil.ignore_patterns(".git", ".nox", "reports", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", ".hypothesis", "shared")


def _run(root: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "GLAI_BACKEND": ""}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the repository's sources with the toy backends' files in
    glai_kernels/backends/ and glai_kernels/sparse/backends/ (the extension's sources are
    unchanged, so its build is reused)."""
    left_over = ROOT / "glai_kernels" / "backends" / f"{MODULE}.py"
    assert not left_over.exists(), f"{left_over} is left over from an earlier run; remove it"
    sparse_left_over = ROOT / "glai_kernels" / "sparse" / "backends" / f"{SPARSE_MODULE}.py"
    assert not sparse_left_over.exists(), f"{sparse_left_over} is left over; remove it"
    root = tmp_path_factory.mktemp("contributor") / "repo"
    shutil.copytree(ROOT, root, ignore=NOT_COPIED)
    (root / left_over.relative_to(ROOT)).write_text(TOY)
    (root / sparse_left_over.relative_to(ROOT)).write_text(SPARSE_TOY)
    return root


def test_the_correctness_suite_runs_a_new_backend(tree):
    toy_backend = NAME
    done = _run(tree, ["-m", "pytest", "correctness/test_backends.py", "-q", "-rA", "-k",
                       f"{toy_backend}-cpu and (oracle or gradients or gradcheck or empty_batch)"],
                timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = re.findall(rf"^PASSED (\S+\[\S*{toy_backend}-cpu\S*\])", done.stdout, re.M)
    assert len(passed) >= 40, done.stdout[-3000:]
    assert any("test_matches_oracle" in p for p in passed)
    assert any("test_gradcheck_float64" in p for p in passed)
    assert not re.search(r"\d+ (failed|error)", done.stdout), done.stdout[-3000:]


def test_the_benchmark_suite_times_a_new_backend(tree, tmp_path):
    toy_backend = NAME
    out = tmp_path / "bench"
    done = _run(tree, ["-m", "bench", "run", "--preset", "quick", "--suite", "kernels",
                       "--device", "cpu", "--backends", f"{toy_backend},einsum", "--heads", "A1",
                       "--batches", "16", "--dtypes", "float32", "--passes", "forward",
                       "--sweeps", "heads", "--no-history", "--no-plots", "--no-progress",
                       "--out", str(out)],
                timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["backend"] == toy_backend]
    assert mine, f"no {toy_backend} rows in {sorted({r['backend'] for r in rows})}"
    assert all(r["status"] == "ok" for r in mine), mine


def test_the_correctness_suite_runs_a_new_sparse_backend(tree):
    done = _run(tree, ["-m", "pytest", "correctness/test_sparse.py", "-q", "-rA", "-k",
                       f"{SPARSE_NAME}-cpu"], timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = re.findall(rf"^PASSED (\S+\[\S*{SPARSE_NAME}-cpu\S*\])", done.stdout, re.M)
    assert len(passed) >= 20, done.stdout[-3000:]
    assert not re.search(r"\d+ (failed|error)", done.stdout), done.stdout[-3000:]


def test_the_sparse_op_and_its_listing_see_a_new_sparse_backend(tree):
    script = textwrap.dedent(f"""
        import torch
        from glai_kernels import sparse
        names = [s.name for s in sparse.backends()]
        assert "{SPARSE_NAME}" in names, names
        weight = torch.randn(3, 4, 5, dtype=torch.float64)
        sw = sparse.from_dense(weight, torch.rand(weight.shape) < 0.5)
        x, act = torch.randn(2, 4, dtype=torch.float64), torch.rand(2, 5, dtype=torch.float64)
        y = sparse.estimator(x, act, sw, backend="{SPARSE_NAME}")
        expected = sparse.estimator(x, act, sw, backend="torch")
        torch.testing.assert_close(y, expected)
        print("ok")
    """)
    done = _run(tree, ["-c", script], timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
