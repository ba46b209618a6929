"""Sessions: `nox -s tests` (the correctness suite), `nox -s lint`, `nox -s bench`,
`nox -s gate` (the regression gate), `nox -s dashboard`, `nox -s cuda_check` (nvcc compile
check of the CUDA kernels, no GPU needed). The benchmark sessions call `glai-bench`, the
command line an editable install of the package provides (bench/__main__.py lists its commands).

Each session makes its own virtual environment and installs everything into it, so a fresh
machine needs only nox. $GLAI_TORCH says which torch to install first (default
torch==2.13.0, which these machines take as a CPU build from local disk); on a CUDA machine
set it to the build that matches the driver, e.g. GLAI_TORCH="torch --index-url ...".
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

TORCH = os.environ.get("GLAI_TORCH", "torch==2.13.0")
# `nox -s bench` with no arguments answers within FIRST_RUN_S of its start (issue 41 item 3);
# its closing lines take a few seconds, and a slow install leaves glai-bench run at least
# FIRST_RUN_FLOOR_S (the time limit then gives way, not the run)
FIRST_RUN_S, FIRST_RUN_CLOSING_S, FIRST_RUN_FLOOR_S = 900, 10, 300


def _progress_module():
    """bench/harness/progress.py by its path (standard library only: nox's own Python has no
    torch), for the bench session's phase times."""
    path = Path(__file__).resolve().parent / "bench" / "harness" / "progress.py"
    spec = importlib.util.spec_from_file_location("_glai_progress", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# made when nox reads this file, before it builds any virtual environment: the bench session's
# first phase (the venv and the install) is timed from here
_PHASES = _progress_module().Phases()


def _install(session: nox.Session, extras: str) -> None:
    session.install(*shlex.split(TORCH))
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The correctness suite, every backend on every device present (`-- ARGS` to pytest)."""
    _install(session, "test,bench")
    session.run("python", "-m", "glai_kernels")
    # one worker per core (at most 4): on CI's two cores 7 minutes instead of 10.6
    # (docs/notes/ci.md, "CI's correctness suite over two workers"); the slowest tests named in
    # the log: where CI's minutes go. The benchmark suite's tests that time nothing they
    # assert on (bench/tests/conftest.py, `shares_cores`) run on the same workers
    session.run("pytest", "correctness/", "bench/tests/", "-m", "not serial", "-n", "auto",
                "--maxprocesses", "4", "--durations=15", "--benchmark-disable",
                *session.posargs)
    # the rest of bench/tests, alone in one process: they time real runs against each other
    # (the gate's planted slowdown), against the ceilings or against a time limit, which a
    # second worker would disturb (docs/notes/ci.md, "bench/tests beside the correctness
    # suite (stop 54)")
    session.run("pytest", "bench/tests/", "-m", "serial", "--benchmark-disable", "-q")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite on the first-run preset (the paper's heads at the paper's batch
    with the peers, the kept-fraction crossover, the pipeline's two-protocol tables) and
    whatever device is present, answering within 15 minutes of the session's start (on a
    machine too slow for all of it, the pipeline leaves out later seeds' units and names
    them); `nox -s bench -- --preset quick|first-run|long|full --backends ... --device ...`
    (arguments of your own: no time limit). The run's dispatch table
    (measured winners) is installed into glai_kernels/dispatch/, so `auto` follows this
    machine's measurements from then on. Ends with the seconds of each phase and the total."""
    _install(session, "bench")
    _PHASES.add("venv and install", _PHASES.total())
    # the C++ extension builds on first use: here, as a phase of its own (the command also
    # lists every backend's availability)
    with _PHASES.phase("extension build (python -m glai_kernels)"):
        session.run("python", "-m", "glai_kernels")
    options = list(session.posargs)
    if not options:
        # the first run answers within FIRST_RUN_S of the session's start: glai-bench run gets
        # what the install and the build left (at least FIRST_RUN_FLOOR_S), and its pipeline
        # leaves out later seeds' units that cannot finish in it, naming them (docs/notes/
        # benchmarks.md, "A first run sized to the machine (issue 41 item 3, stop 54)")
        left = max(FIRST_RUN_FLOOR_S, FIRST_RUN_S - _PHASES.total() - FIRST_RUN_CLOSING_S)
        session.log(f"the first run, sized to answer within {FIRST_RUN_S // 60} minutes: "
                    f"glai-bench run --time-limit {left:.0f} (`nox -s bench -- --preset "
                    "first-run` runs it without a limit)")
        options = ["--time-limit", f"{left:.0f}"]
    with _PHASES.phase("glai-bench run (its phases above)"):
        session.run("glai-bench", "run", "--install-dispatch", *options)
    for line in _PHASES.lines("nox -s bench"):
        session.log(line)


@nox.session
def gate(session: nox.Session) -> None:
    """The regression gate: this checkout against a base commit (the merge base with main, or
    HEAD~1 on main; `-- check --base REV`), both timed here on the quick preset's cases in
    interleaved fresh processes, their same-run ratios compared with thresholds from the
    runs' own spread (bench/gate/paired.py); then against the committed baseline for this
    kind of machine (reports/baseline/) where one exists. So a new machine kind is never
    compared with nothing. `nox -s gate -- accept` measures 10 fresh-process runs and writes
    a new baseline on purpose; `-- check --plant torch=1.25` shows it failing on a planted
    slowdown."""
    _install(session, "bench")
    session.run("glai-bench", "gate", *(session.posargs or ["check", "--baseline"]))


@nox.session
def dashboard(session: nox.Session) -> None:
    """Render reports/dashboard/index.html from the history in reports/history/."""
    _install(session, "bench")
    session.run("glai-bench", "dashboard", *session.posargs)


@nox.session
def cuda_check(session: nox.Session) -> None:
    """Compile every .cu of the extension with nvcc for sm_80 and sm_90 (`-Xptxas -v`), fail on
    a compile error or a register spill, write the report to reports/ptxas/, and compile the
    torch binding with -fsyntax-only. Needs nvcc, not a GPU (`-- --arch 80 --arch 100` to
    choose the architectures). Then every C++ source against the headers of the oldest torch
    the package admits (`glai-bench check-headers`: CI builds against one release only)."""
    session.install(*shlex.split(TORCH), "numpy")
    session.install("-e", ".")  # for the glai-bench command
    session.run("glai-bench", "check-cuda", *session.posargs)
    session.run("glai-bench", "check-headers", "--skip-if-offline")
