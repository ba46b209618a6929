"""The fuzzer: per backend and device, thousands of hypothesis cases against the float64 oracle.

Each case (correctness/fuzz.py) draws a shape across the kernels' tile edges, a dtype, gates
from binary to extreme magnitudes, bias or not, which inputs need a gradient, and a layout
for each input and for dy (contiguous, strided, expanded). Counts per run: `EXAMPLES`
(2,000) for every backend, 300 for Triton under its CPU interpreter; $GLAI_FUZZ_EXAMPLES
changes the first (and the second in proportion) for a quicker or a deeper local run.
`compile` runs its cases over `COMPILE_KEYS` (shape, dtype, gradients) triples drawn from the
run's seed, since each new one compiles a graph (fuzz.graph_keys).

The sparse op (glai_kernels.sparse) has its own fuzzer below: the same cases plus a
kept-path mask (densities from none to all, rows of outputs, inputs or paths left empty),
every sparse backend on every device it declares (triton on CPU under its interpreter)
against the float64 dense oracle on the masked weight, forward and every gradient; and a
corrupted index (one entry of one field changed), which construction and a direct call of
the custom op must refuse naming a field. `SPARSE_EXAMPLES` (500) cases per backend and
device, 15% of them for interpreted Triton: fewer than the dense op's, since the sparse
backends share the dense ones' arithmetic and what is new is the walk over the index,
whose edges small shapes reach (about 30 s in all on the shared 2-core machine).

The seed changes every run and is printed in pytest's header and in a failure's message;
`GLAI_FUZZ_SEED=<seed> pytest correctness/test_properties.py` draws the same cases again. No
example database is kept: a run's cases depend on its seed alone.
"""

from __future__ import annotations

import math
import os
import re
import zlib

import pytest
import torch
from backends_under_test import backend_param
from checker import check
from fuzz import (
    FUZZ_SEED_VAR,
    build,
    cases,
    cases_over,
    corrupt,
    describe,
    fuzz_seed,
    graph_keys,
    kept_mask,
    penalty,
    sparse_cases,
)
from hypothesis import HealthCheck, given, seed, settings
from sparse_checker import oracle_failures

import glai_kernels
import glai_kernels.sparse as sparse
from glai_kernels import registry
from glai_kernels.sparse import SPARSE_ESTIMATOR, SparsePathWeight, from_dense
from reference.verdict import judge

EXAMPLES = int(os.environ.get("GLAI_FUZZ_EXAMPLES", "2000"))
SPARSE_EXAMPLES = max(1, EXAMPLES // 4)
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
    C++ kernels' results do not depend on the thread count (test_extension_kernels.py checks it)."""
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


def sparse_params() -> list:
    """(sparse backend, device) for every sparse backend (or $GLAI_BACKEND's alone) on every
    device it declares, skipped where it cannot run."""
    chosen = os.environ.get(registry.ENV_VAR)
    names = SPARSE_ESTIMATOR.names()
    if chosen and chosen != registry.AUTO:
        names = [n for n in names if n == chosen]
    return [backend_param(n, SPARSE_ESTIMATOR.get(n), device) for n in names
            for device in SPARSE_ESTIMATOR.get(n).devices]


def check_sparse_case(name: str, case: dict, device: str = "cpu") -> list[str]:
    """What of sparse.estimator on `name` misses the float64 dense oracle on the masked
    weight, for one drawn case (empty when everything passes)."""
    data, dy = build(case, device)
    mask = kept_mask(case, device)
    sw = from_dense(data.weight.detach(), mask)
    needs = set(case["grads"]) | ({"values"} if "weight" in case["grads"] else set())
    tensors = {"x": data.x, "act": data.act, "values": sw.values, "bias": data.bias}
    dense = data.weight.detach().double() * mask

    def compare(quantity, actual, expected, scale):
        verdict = judge(actual, expected, scale, case["dtype"])
        if not verdict.ok:
            return (f"{quantity}: error {verdict.error:.3g} > tolerance "
                    f"{verdict.tolerance:.3g} {verdict.reason}")
        return None

    return oracle_failures(name, tensors, needs, sw, dense, dy, compare)


def check_sparse_double_backward(name: str, case: dict, device: str = "cpu") -> list[str]:
    """A gradient penalty through the sparse op: s = sum(r * dx) with dx taken with
    create_graph, then ds/dact and ds/dvalues, against the float64 dense einsums on the
    masked weight (dx is linear in act and the weight: ds/dact[b, s] = sum_{o,i} dy[b, o]
    r[b, i] W[o, i, s], ds/dW[o, i, s] = sum_b dy[b, o] r[b, i] act[b, s], at the kept
    entries). Empty when it holds. Every dtype, at its own tolerance: each of these second
    derivatives is one op call on exact inputs, r drawn as x is (fuzz.py, "Double backward",
    and `penalty`)."""
    data, dy = build(case, device)
    mask = kept_mask(case, device)
    sw = from_dense(data.weight.detach(), mask)
    x = data.x.detach().requires_grad_(True)
    act = data.act.detach().requires_grad_(True)
    values = sw.values.requires_grad_(True)
    r = penalty(case, x, act, data.weight, dy)
    y = sparse.estimator(x, act, sw, backend=name)
    (dx,) = torch.autograd.grad(y, x, dy, create_graph=True)
    got_act, got_values = torch.autograd.grad((dx * r).sum(), [act, values], allow_unused=True)
    dense = data.weight.detach().double() * mask
    d64, r64, a64 = dy.double(), r.double(), act.detach().double()
    expected = {"act": torch.einsum("bo,bi,ois->bs", d64, r64, dense),
                "values": torch.einsum("bo,bi,bs->ois", d64, r64, a64)[sw.entries()]}
    scale = {"act": torch.einsum("bo,bi,ois->bs", d64.abs(), r64.abs(), dense.abs()),
             "values": torch.einsum("bo,bi,bs->ois", d64.abs(), r64.abs(),
                                    a64.abs())[sw.entries()]}
    failures = []
    for quantity, actual in (("act", got_act), ("values", got_values)):
        if actual is None:  # a gradient the graph dropped: silently wrong before issue 40
            failures.append(f"d(r.dx)/d{quantity} is missing (dx came back detached)")
            continue
        verdict = judge(actual, expected[quantity], scale[quantity], case["dtype"])
        if not verdict.ok:
            failures.append(f"d(r.dx)/d{quantity}: error {verdict.error:.3g} > tolerance "
                            f"{verdict.tolerance:.3g} {verdict.reason}")
    return failures


def check_corrupt_index(name: str, case: dict, device: str = "cpu") -> list[str]:
    """One entry of one index field changed: SparsePathWeight and a direct call of the
    custom op both refuse it (the op checks an index it has not seen in full, as
    construction does), naming a field: that field, when the value is out of its range."""
    data, _ = build(case, device)
    sw = from_dense(data.weight.detach(), kept_mask(case, device))
    if not any(t.numel() for t in sw.index):
        return []
    bad, field, outside = corrupt(sw.index, case["seed"])
    named = rf"index\.{field}\b" if outside else r"index\.\w+"
    failures = []
    try:
        SparsePathWeight(sw.values.detach(), bad)
        failures.append(f"SparsePathWeight took {field} changed")
    except ValueError as e:
        if not re.search(named, str(e)):
            failures.append(f"SparsePathWeight, {field} changed: {e}")
    x, act = data.x.contiguous(), data.act.contiguous()
    try:
        torch.ops.glai.sparse_estimator(x, act, sw.values.detach(), list(bad), None, name, False)
        failures.append(f"the custom op took {field} changed")
    except ValueError as e:
        if not re.search(named, str(e)):
            failures.append(f"the custom op, {field} changed: {e}")
    return failures


@pytest.mark.parametrize("sparse_backend", sparse_params())
def test_sparse_random_cases_match_oracle(sparse_backend, one_thread):
    name, device = sparse_backend
    wanted = (max(1, math.ceil(SPARSE_EXAMPLES * INTERPRETED_SHARE))
              if name == "triton" and device == "cpu" else SPARSE_EXAMPLES)
    run_seed = (fuzz_seed() + zlib.crc32(f"sparse-{name}-{device}".encode())) % 2**32
    replay = (f"replay: {FUZZ_SEED_VAR}={fuzz_seed()} pytest correctness/test_properties.py "
              f"-k 'sparse and {name}-{device}'")
    ran = []

    @seed(run_seed)
    @settings(max_examples=wanted, deadline=None, database=None, derandomize=False,
              print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    @given(case=sparse_cases)
    def one_case(case):
        ran.append(case)
        failures = (check_sparse_case(name, case, device)
                    + check_sparse_double_backward(name, case, device)
                    + check_corrupt_index(name, case, device))
        assert not failures, (f"sparse {name} on {device}, {describe(case)} mask "
                              f"{case['mask']}: " + "; ".join(failures) + f" ({replay})")

    one_case()
    assert len(ran) >= wanted, f"hypothesis ran {len(ran)} cases of {wanted} ({replay})"
