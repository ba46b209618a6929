"""The fuzzer: per backend and device, thousands of hypothesis cases against the float64 oracle.

Each case (correctness/fuzz.py) draws a shape across the kernels' tile edges, a dtype, gates
from binary to extreme magnitudes, bias or not, which inputs need a gradient, and a layout
for each input and for dy (contiguous, strided, expanded). Counts per run: `EXAMPLES`
(2,000) for every backend, 300 for Triton under its CPU interpreter; $GLAI_FUZZ_EXAMPLES
changes the first (and the second in proportion) for a quicker or a deeper local run.
`compile` runs its cases over `COMPILE_KEYS` (shape, dtype, gradients) triples drawn from the
run's seed, since each new one compiles a graph (fuzz.graph_keys).

The seed changes every run and is printed in pytest's header and in a failure's message;
`GLAI_FUZZ_SEED=<seed> pytest correctness/test_properties.py` draws the same cases again. No
example database is kept: a run's cases depend on its seed alone.
"""

from __future__ import annotations

import math
import os
import zlib

import pytest
import torch
from checker import check
from fuzz import FUZZ_SEED_VAR, build, cases, cases_over, describe, fuzz_seed, graph_keys
from hypothesis import HealthCheck, given, seed, settings

import glai_kernels

EXAMPLES = int(os.environ.get("GLAI_FUZZ_EXAMPLES", "2000"))
# Triton's interpreter pays ~10 ms per program instance, so its cases are 15% as many
INTERPRETED_SHARE = 3 / 20
# torch.compile compiles a graph per new dtype, gradient set, or size 0/1/equal sizes (~2 s
# each): its cases spread over this many (shape, dtype, grads) keys, new ones each run
COMPILE_KEYS = 2


def examples(name: str, device: str) -> int:
    """How many cases one backend on one device runs."""
    if name == "triton" and device == "cpu":
        return max(1, math.ceil(EXAMPLES * INTERPRETED_SHARE))
    return EXAMPLES


@pytest.fixture
def one_thread():
    """One torch thread for the run: each case is small, and on a shared 2-core machine the
    oracle's two-thread BLAS calls wait for a core (60 ms instead of 0.1 ms measured). The
    C++ kernels' results do not depend on the thread count (test_extension.py checks it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_random_cases_match_oracle(backend_device, one_thread):
    name, device = backend_device
    wanted = examples(name, device)
    run_seed = (fuzz_seed() + zlib.crc32(f"{name}-{device}".encode())) % 2**32
    replay = (f"replay: {FUZZ_SEED_VAR}={fuzz_seed()} pytest correctness/test_properties.py "
              f"-k '{name}-{device}'")
    ran = []

    def fn(x, act, weight, bias):
        return glai_kernels.estimator(x, act, weight, bias, backend=name)

    @seed(run_seed)
    @settings(max_examples=wanted, deadline=None, database=None, derandomize=False,
              print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases_over(graph_keys(run_seed, COMPILE_KEYS)) if name == "compile" else cases)
    def one_case(case):
        ran.append(case)
        inputs, dy = build(case, device)
        failures = check(fn, *case["shape"], dtype=case["dtype"], device=device,
                         grads=tuple(sorted(case["grads"])), given=inputs, dy=dy)
        assert not failures, (f"{name} on {device}, {describe(case)}: "
                              + "; ".join(map(str, failures)) + f" ({replay})")

    one_case()
    assert len(ran) >= wanted, f"hypothesis ran {len(ran)} cases of {wanted} ({replay})"
