"""pytest bench/: the suite's own tests and the pytest-benchmark cases.

Adds the run's provenance (commit, versions, CPU model, threads, and on CUDA the GPU's name,
clocks and power limit) to pytest-benchmark's machine info, so a saved JSON
(`--benchmark-json`, `--benchmark-autosave`) says where it was measured and
`--benchmark-compare` compares like with like.
"""

from __future__ import annotations

import torch

from bench.harness import provenance


def benchmark_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_benchmark_update_machine_info(config, machine_info):
    info = provenance.collect(benchmark_device())
    machine_info["glai"] = info
    if "gpu_name" in info:
        machine_info["gpu"] = {k: v for k, v in info.items() if k.startswith(("gpu_", "cuda"))}


def pytest_configure(config):
    config.addinivalue_line("markers", "benchcase: a timed pytest-benchmark case")
