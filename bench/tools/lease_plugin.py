"""A pytest plugin for running the tests inside a short lease of a GPU machine
(bench/tools/on_gpu.sh): the run ends by itself in time, and what failed is on disk as it
fails.

Two environment variables, both off by default (the root conftest.py loads this plugin for
every run, so they reach xdist's workers too):

    GLAI_TESTS_UNTIL=<unix time>   tests not started by then are skipped, saying so; pytest
                                   then finishes and prints its report instead of being
                                   killed mid-run with it (as a lease's deadline would)
    GLAI_TESTS_FAILURES=<path>     each failing or erroring test's id and traceback are
                                   appended to this file the moment it fails
"""

from __future__ import annotations

import os
import time

import pytest

UNTIL_VAR = "GLAI_TESTS_UNTIL"
FAILURES_VAR = "GLAI_TESTS_FAILURES"


def _until() -> float | None:
    text = os.environ.get(UNTIL_VAR, "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise pytest.UsageError(f"${UNTIL_VAR} must be a unix time in seconds, got {text!r}") \
            from None


def pytest_configure(config: pytest.Config) -> None:
    _until()  # a malformed value stops the run before any test


def pytest_runtest_setup(item: pytest.Item) -> None:
    until = _until()
    if until is not None and time.time() > until:
        pytest.skip(f"not run: the run's time budget (${UNTIL_VAR}) was spent")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(FAILURES_VAR)
    if not path or not report.failed:
        return
    # one write per failure, opened for appending: several xdist workers share the file
    text = f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
