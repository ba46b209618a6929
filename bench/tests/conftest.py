"""pytest bench/: the suite's own tests and the pytest-benchmark cases.

Adds the run's provenance (commit, versions, CPU model, threads, and on CUDA the GPU's name,
clocks and power limit) to pytest-benchmark's machine info, so a saved JSON
(`--benchmark-json`, `--benchmark-autosave`) says where it was measured and
`--benchmark-compare` compares like with like.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.harness import provenance


def benchmark_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_benchmark_update_machine_info(config, machine_info):
    info = provenance.collect(benchmark_device())
    machine_info["glai"] = info
    if "gpu_name" in info:
        machine_info["gpu"] = {k: v for k, v in info.items() if k.startswith(("gpu_", "cuda"))}


HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line("markers", "benchcase: a timed pytest-benchmark case")
    config.addinivalue_line(
        "markers", "shares_cores: a module whose tests time nothing they assert on, so they "
                   "may run beside another worker (`nox -s tests` runs them on pytest-xdist's "
                   "workers with the correctness suite)")
    config.addinivalue_line(
        "markers", "serial: added to every test here not marked shares_cores; `nox -s tests` "
                   "runs these alone in one process, after everything else")


def pytest_collection_modifyitems(config, items):
    """Mark `serial` every test of bench/tests whose module does not claim `shares_cores`.

    Serial is the default: a new module whose tests compare timings, measure ceilings or run
    against a time limit is safe without saying anything, and only a module that times nothing
    it asserts on opts into sharing the cores (docs/notes/ci.md, "bench/tests beside the
    correctness suite (stop 54)")."""
    for item in items:
        if item.path.resolve().parent == HERE and item.get_closest_marker("shares_cores") is None:
            item.add_marker(pytest.mark.serial)
