"""Which backends and devices the suite runs on.

Every registered backend runs on every device it declares; a device this machine lacks
(CUDA here) or a backend unavailable on it is skipped with the registry's reason, so the
same command runs everything on a GPU machine. `GLAI_BACKEND=name pytest correctness/`
restricts the backend-parametrised tests to that backend.

The repository's root conftest.py turns on Triton's interpreter on a machine without CUDA
(it must be chosen before glai_kernels is imported, which bench/tests/conftest.py may do first).
"""

from __future__ import annotations

import pytest
import torch
from backends_under_test import backend_param, backends_under_test
from fuzz import FUZZ_SEED_VAR, fuzz_seed
from spy_backends import spy_backend

from glai_kernels import dispatch, extension, registry
from glai_kernels.extension_build import Build

DEVICES = ("cpu", "cuda")
def pytest_report_header(config) -> str:
    return (f"fuzz seed: {FUZZ_SEED_VAR}={fuzz_seed()} (set it to replay this run's "
            f"correctness/test_properties.py cases)")


def backend_device_params() -> list:
    params = []
    for name in backends_under_test():
        backend = registry.get(name)
        for device in DEVICES:
            if device not in backend.devices:
                continue
            params.append(backend_param(name, backend, device))
    return params


@pytest.fixture(params=backend_device_params())
def backend_device(request) -> tuple[str, str]:
    """(backend name, device) for every available pair."""
    return request.param


def pytest_collection_modifyitems(config, items):
    """The paper heads' checks in head and device order, backends within each (collection gives
    backends outside): a worker then checks one head's draw on the backends in a row, and
    checker.check(memo=True) reuses its float64 oracle instead of drawing B1's 52 M weights
    and their oracle again for each backend."""
    places = [i for i, item in enumerate(items)
              if getattr(item, "originalname", None) == "test_paper_heads_small_batch"]
    by_head = sorted((items[i] for i in places), key=lambda item: (
        item.callspec.params["head"].name, item.callspec.params["backend_device"][1]))
    for i, item in zip(places, by_head, strict=True):
        items[i] = item


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on a CUDA device")
    config.addinivalue_line("markers", "slow: a long case (the paper's large heads)")


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test, restored after."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


@pytest.fixture
def spy_calls():
    """Two CPU backends recording their calls (spy_backends.py), registered for one test:
    spy_high outranks spy_low by priority. Yields the calls, "<name>.forward" or
    "<name>.backward", in order; the backends and the dispatch cache go afterwards."""
    calls: list[str] = []
    registry.register(spy_backend("spy_low", 1_000, calls))
    registry.register(spy_backend("spy_high", 2_000, calls))
    yield calls
    registry.unregister("spy_low")
    registry.unregister("spy_high")
    dispatch.clear_cache()


@pytest.fixture(scope="module")
def built() -> Build:
    """The glai_ext extension, built or loaded, its ops' fakes registered (skipped where it
    cannot be)."""
    result = extension.load()
    if result.error is not None:
        pytest.skip(f"the extension is unavailable here: {result.error}")
    return result


@pytest.fixture
def parallel_always(built):
    """Every sparse kernel call split over all of torch's threads, whatever its size."""
    previous = torch.ops.glai_ext.sparse_min_work(0)
    threads = torch.get_num_threads()
    yield
    torch.ops.glai_ext.sparse_min_work(previous)
    torch.set_num_threads(threads)


@pytest.fixture(params=["avx512", "avx2", "portable"])
def isa(request):
    """Each instruction set of the cpp kernels in turn (skipped where this CPU or the
    extension lacks it), restoring the run-time choice afterwards."""
    if extension.load().error is not None:
        pytest.skip(f"the extension is unavailable here: {extension.load().error}")
    previous = torch.ops.glai_ext.cpu_isa()
    try:
        torch.ops.glai_ext.cpu_isa(request.param)
    except RuntimeError as error:
        pytest.skip(str(error))
    yield request.param
    torch.ops.glai_ext.cpu_isa(previous)
