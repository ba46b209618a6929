"""Seeded property-based tests: random shapes, dtypes, gates, bias and gradient subsets."""

from __future__ import annotations

import os

from backends_under_test import backends_under_test
from checker import check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glai_kernels
from glai_kernels import registry
from glai_kernels.contract import SUPPORTED_DTYPES

EXAMPLES = int(os.environ.get("GLAI_HYPOTHESIS_EXAMPLES", "12"))

cases = st.fixed_dictionaries({
    "shape": st.tuples(st.integers(0, 9), st.integers(1, 9), st.integers(1, 9),
                       st.integers(1, 9)),
    "dtype": st.sampled_from(SUPPORTED_DTYPES),
    "gates": st.sampled_from(["binary", "soft"]),
    "bias": st.booleans(),
    "grads": st.sets(st.sampled_from(["x", "act", "weight", "bias"])),
    "seed": st.integers(0, 2**16),
})


def _runnable_on_cpu() -> list[str]:
    return [n for n in backends_under_test() if registry.get(n).unsupported_reason("cpu") is None]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=cases, name=st.sampled_from(_runnable_on_cpu()))
def test_random_cases_match_oracle(case, name):
    def run(x, act, weight, bias):
        return glai_kernels.estimator(x, act, weight, bias, backend=name)

    grads = tuple(sorted(case["grads"])) if case["shape"][0] else ()
    failures = check(run, *case["shape"], dtype=case["dtype"], seed=case["seed"],
                     gates=case["gates"], bias=case["bias"], grads=grads)
    assert not failures, "; ".join(map(str, failures))
