"""bench/tools/lease_plugin.py: a run that ends by itself at its time budget, and failures written
to disk as they happen (each checked in a pytest subprocess over a small test file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.tools.lease_plugin import FAILURES_VAR, UNTIL_VAR

ROOT = Path(__file__).resolve().parents[2]
TESTS = '''
def test_passes():
    assert True


def test_fails():
    assert 6 * 7 == 43, "the planted failure"
'''


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_planted.py").write_text(TESTS)
    environment = {k: v for k, v in os.environ.items() if k not in (UNTIL_VAR, FAILURES_VAR)}
    environment.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "bench.tools.lease_plugin", "-p", "no:cacheprovider",
         "-rs", "-q", "test_planted.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)


def test_failures_are_written_as_they_happen(tmp_path):
    log = tmp_path / "failures.txt"
    run = _pytest(tmp_path, **{FAILURES_VAR: str(log)})
    assert run.returncode == 1, run.stdout + run.stderr
    text = log.read_text()
    assert "test_planted.py::test_fails (call)" in text and "the planted failure" in text
    assert "test_passes" not in text


def test_tests_past_the_budget_are_skipped_and_the_run_reports(tmp_path):
    run = _pytest(tmp_path, **{UNTIL_VAR: str(time.time() - 1)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 skipped" in run.stdout and "time budget" in run.stdout
    in_time = _pytest(tmp_path, **{UNTIL_VAR: str(time.time() + 3600)})
    assert "1 failed, 1 passed" in in_time.stdout


def test_a_malformed_budget_stops_the_run_naming_the_variable(tmp_path):
    run = _pytest(tmp_path, **{UNTIL_VAR: "soon"})
    assert run.returncode == 4
    assert UNTIL_VAR in run.stderr and "'soon'" in run.stderr
