"""The suite's cases as pytest-benchmark tests: `pytest bench/tests/test_benchmarks.py`.

By default a small list (two paper heads at their training batch, float32, forward and
forward+backward) so CI stays fast; GLAI_BENCH_PRESET=quick|default|full runs a preset's
cases instead. Every case first checks its output against the float64 oracle (a wrong
backend fails, it is not timed), then is timed by pytest-benchmark, with GFLOP/s, GB/s and
joules per call (NVIDIA GPUs; None elsewhere) in `extra_info`.

    pytest bench/tests/test_benchmarks.py --benchmark-json=out.json
    pytest bench/tests/test_benchmarks.py --benchmark-autosave     # later: --benchmark-compare
"""

from __future__ import annotations

import os

import pytest
import torch

from bench.harness.energy import EnergyMeter, ImplausibleEnergyError
from bench.harness.oracle import Oracle, tf32_enabled
from bench.harness.passes import PASSES, dtype_of, make_call
from bench.harness.runner import make_sets
from bench.harness.sweeps import PRESETS, Case, expand
from bench.tests.conftest import benchmark_device
from glai_kernels import registry
from glai_kernels.glai.paper_training import paper_training
from glai_kernels.paper_heads import PAPER_HEADS

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

DEFAULT_CASES = [
    Case("heads", head, PAPER_HEADS[head].shape(paper_training(PAPER_HEADS[head]).batch_size),
         "float32",
         ("forward", "both"))
    for head in ("A1", "C2")
]


def _cases() -> list[Case]:
    preset = os.environ.get("GLAI_BENCH_PRESET")
    return expand(PRESETS[preset]) if preset else DEFAULT_CASES


def _params():
    device = benchmark_device()
    seen, params = set(), []
    for case in _cases():
        for pass_ in case.passes:
            key = (case.shape, case.dtype, pass_)
            if key in seen:
                continue
            seen.add(key)
            for name in registry.names():
                reason = registry.get(name).unsupported_reason(device.type, dtype_of(case.dtype))
                s = case.shape
                marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
                params.append(pytest.param(
                    name, case, pass_, marks=marks,
                    id=f"{name}-{case.head}-B{s.batch}-I{s.inputs}-P{s.paths}-O{s.outputs}"
                       f"-{case.dtype}-{pass_}"))
    return params


@pytest.mark.benchcase
@pytest.mark.parametrize(("backend", "case", "pass_"), _params())
def test_estimator(benchmark, backend: str, case: Case, pass_: str):
    device = benchmark_device()
    dtype = dtype_of(case.dtype)
    spec = PASSES[pass_]
    sets = make_sets(case.shape, dtype, device, seed=0)
    call = make_call(backend, spec, sets)

    ratio = Oracle(sets[0]).error_ratio(call(), tf32=dtype == torch.float32
                                        and tf32_enabled(device))
    assert ratio <= 1.0, f"{backend} misses the float64 oracle: {ratio:.3g}x its tolerance"

    if device.type == "cuda":
        def timed():
            call.timed()
            torch.cuda.synchronize(device)
    else:
        timed = call.timed
    benchmark.group = f"{case.head} B={case.shape.batch} {case.dtype} {pass_}"
    benchmark(timed)

    flops = spec.flops(case.shape)
    nbytes = spec.min_bytes(case.shape, dtype.itemsize)
    benchmark.extra_info.update({
        "backend": backend, "head": case.head, **case.shape.as_dict(), "dtype": case.dtype,
        "pass": pass_, "device": device.type, "flops": flops, "bytes": nbytes,
        "error_ratio": ratio,
    })
    if benchmark.stats is None:  # --benchmark-disable: ran once, as a correctness check
        return
    median = benchmark.stats.stats.median
    meter = EnergyMeter(device)
    energy, why = None, f"absent: {meter.reason}"
    if meter.available:
        try:
            energy, why = meter.measure(call.timed, median), meter.describe()
        except ImplausibleEnergyError as e:
            why = f"absent: {e}"
    benchmark.extra_info.update({
        "gflops": flops / median / 1e9, "gbps": nbytes / median / 1e9,
        "joules": energy.joules_per_call if energy else None,
        "watts": energy.watts if energy else None,
        "energy": why,
    })
    assert median > 0 and benchmark.extra_info["gflops"] > 0
