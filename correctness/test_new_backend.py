"""A new contributor's backend is one file: written into glai_kernels/backends/, it is run
by the correctness suite and timed by the benchmark suite with no other edit.

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


# what the copy leaves out: history, reports and build outputs no test here reads
NOT_COPIED = shutil.ignore_patterns(".git", ".nox", "reports", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", ".hypothesis", "shared")


def _run(root: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "GLAI_BACKEND": ""}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the repository's sources with the toy backend's file in
    glai_kernels/backends/ (the extension's sources are unchanged, so its build is reused)."""
    left_over = ROOT / "glai_kernels" / "backends" / f"{MODULE}.py"
    assert not left_over.exists(), f"{left_over} is left over from an earlier run; remove it"
    root = tmp_path_factory.mktemp("contributor") / "repo"
    shutil.copytree(ROOT, root, ignore=NOT_COPIED)
    (root / left_over.relative_to(ROOT)).write_text(TOY)
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
