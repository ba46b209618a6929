"""The one command line: `python -m bench COMMAND` dispatches every command, each answers
--help, options alone still mean `run`, and the installed `glai-bench` launcher
(glai_kernels/cli.py) runs the suite from the checkout whatever the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from glai_kernels import cli

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # the repository on PYTHONPATH as a test run has it, so glai_kernels imports uninstalled
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_python_m_bench_help_lists_every_command():
    out = _run(["-m", "bench", "--help"], ROOT)
    assert out.returncode == 0, out.stderr
    for name in bench_main.COMMANDS:
        assert f"  {name} " in out.stdout, out.stdout


@pytest.mark.parametrize("command", list(bench_main.COMMANDS))
def test_each_command_answers_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main.main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_options_alone_mean_run(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--preset", "quick", "--help"])
    assert exit_.value.code == 0
    assert "usage: glai-bench run" in capsys.readouterr().out


def test_the_launcher_runs_the_checkouts_suite_from_anywhere(tmp_path):
    """From another directory (no bench/ there) the launcher still finds the checkout's."""
    out = _run(["-m", "glai_kernels.cli", "gate", "--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "check" in out.stdout and "accept" in out.stdout and "measure" in out.stdout


def test_the_launcher_says_what_to_do_without_a_checkout(monkeypatch, capsys):
    """A wheel install has glai_kernels but no bench/ beside it."""
    monkeypatch.setattr(cli, "checkout", lambda: None)
    assert cli.main(["run"]) == 2
    assert "pip install -e" in capsys.readouterr().err


def test_the_launcher_puts_the_checkout_first_on_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    root = cli.checkout()
    assert root == ROOT
    assert cli.environment(root)["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert cli.command(["gate", "check"])[1:] == ["-m", "bench", "gate", "check"]


def test_matmul_precision_reaches_the_suite_and_its_provenance(tmp_path, monkeypatch):
    """`run --matmul-precision high` sets torch's float32 precision before the suite runs (so
    the `cuda` binding and cuBLAS may use TF32) and the run's provenance records it."""
    import torch

    from bench.harness import provenance, suite

    seen: dict[str, object] = {}

    def fake_run(*args, **kwargs):
        seen["precision"] = torch.get_float32_matmul_precision()
        seen["provenance"] = provenance.collect(torch.device("cpu"))
        raise ValueError("stop here")  # the CLI turns it into exit status 2

    before = torch.get_float32_matmul_precision()
    monkeypatch.setattr(suite, "run", fake_run)
    try:
        code = bench_main.main(["run", "--suite", "kernels", "--device", "cpu", "--no-history",
                                "--out", str(tmp_path / "out"), "--matmul-precision", "high"])
    finally:
        torch.set_float32_matmul_precision(before)
    assert code == 2
    assert seen["precision"] == "high"
    assert seen["provenance"]["float32_matmul_precision"] == "high"
    assert provenance.collect(torch.device("cpu"))["float32_matmul_precision"] == before
