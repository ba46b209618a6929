"""`glai-bench`: the benchmarks' command line, installed with the package.

The benchmark suite (`bench/`) is not part of the installed distribution: it lives in the
repository, beside `glai_kernels/`. So this launcher finds the checkout the package was
installed from in editable mode (`pip install -e .`, as nox does) and runs
`python -m bench ARGS` there, with that checkout on PYTHONPATH; the commands themselves are
listed by `glai-bench --help` (bench/__main__.py). From a wheel install there is no bench/
to run, and it says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROG = "glai-bench"


def checkout() -> Path | None:
    """The repository this package was loaded from, when it holds the benchmark suite."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "bench" / "__main__.py").is_file() else None


def command(argv: list[str]) -> list[str]:
    """The child's command line: this interpreter running the suite's entry point."""
    return [sys.executable, "-m", "bench", *argv]


def environment(root: Path) -> dict[str, str]:
    """This process's environment with `root` first on PYTHONPATH (children the suite starts,
    such as the gate's fresh-process runs, inherit it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return env


def main(argv: list[str] | None = None) -> int:
    """Run `python -m bench ARGS` from the checkout; returns its exit status (on POSIX the
    process becomes the child instead, so signals and the status pass straight through)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    root = checkout()
    if root is None:
        here = Path(__file__).resolve().parent.parent
        print(f"{PROG}: no benchmark suite next to the installed package ({here}/bench is "
              f"missing). The benchmarks ship with the repository, not the wheel: clone it "
              f"and install it editable (`pip install -e .[bench]`), then run {PROG} again.",
              file=sys.stderr)
        return 2
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, command(argv), environment(root))
    return subprocess.call(command(argv), env=environment(root))


if __name__ == "__main__":
    raise SystemExit(main())
