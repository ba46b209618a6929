"""Backend selection: the argument, $GLAI_BACKEND, "auto", and what backends() reports."""

from __future__ import annotations

import pytest
import torch

import glai_kernels
from glai_kernels import dispatch, registry
from glai_kernels.contract import Shape


@pytest.fixture
def spy_backends(tmp_path, monkeypatch, spy_calls):
    """Two registered backends that record their calls (correctness/conftest.py), removed
    afterwards. No dispatch table is read meanwhile: these tests are of the priorities, which
    decide auto where this machine kind has no table (correctness/test_dispatch.py tests the
    tables)."""
    monkeypatch.setattr(dispatch, "TABLE_DIR", tmp_path)
    dispatch.clear_cache()
    return spy_calls


def _args():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(3, 4, generator=gen), torch.randn(3, 2, generator=gen),
            torch.randn(5, 4, 2, generator=gen, requires_grad=True))


def test_argument_beats_environment(spy_backends, monkeypatch):
    monkeypatch.setenv("GLAI_BACKEND", "spy_high")
    glai_kernels.estimator(*_args(), backend="spy_low").sum().backward()
    assert spy_backends == ["spy_low.forward", "spy_low.backward"]


def test_environment_sets_default(spy_backends, monkeypatch):
    monkeypatch.setenv("GLAI_BACKEND", "spy_low")
    glai_kernels.estimator(*_args())
    assert spy_backends == ["spy_low.forward"]


def test_auto_takes_highest_priority(spy_backends, monkeypatch):
    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    glai_kernels.estimator(*_args()).sum().backward()
    assert spy_backends == ["spy_high.forward", "spy_high.backward"]
    assert registry.pick_auto("cpu", torch.float32).name == "spy_high"


def test_backward_runs_on_the_forwards_backend(spy_backends, monkeypatch):
    monkeypatch.setenv("GLAI_BACKEND", "spy_low")
    y = glai_kernels.estimator(*_args())
    monkeypatch.setenv("GLAI_BACKEND", "spy_high")
    y.sum().backward()
    assert spy_backends == ["spy_low.forward", "spy_low.backward"]


def test_only_needed_gradients_are_asked_for(spy_backends):
    seen = []
    original = registry.get("spy_low").backward

    def recording(dy, x, act, weight, needs):
        seen.append(needs)
        return original(dy, x, act, weight, needs)

    registry.unregister("spy_low")
    registry.register(registry.Backend(
        name="spy_low", forward=lambda x, a, w: x.new_zeros(len(x), len(w)),
        backward=recording, devices=("cpu",), description="spy"))
    x, act, weight = _args()
    glai_kernels.estimator(x, act, weight, backend="spy_low").sum().backward()
    assert seen == [(False, False, True)]


def test_one_process_compares_backends():
    x, act, weight = _args()
    results = {name: glai_kernels.estimator(x, act, weight, backend=name)
               for name in ("einsum", "torch")}
    torch.testing.assert_close(results["einsum"], results["torch"])


def test_backends_report_availability_and_reasons():
    statuses = {s.name: s for s in glai_kernels.backends()}
    assert {"einsum", "torch", "compile"} <= set(statuses)
    for status in statuses.values():
        assert status.devices, status.name
        for device, reason in status.devices.items():
            assert reason is None or (isinstance(reason, str) and reason), (status.name, device)
    assert statuses["torch"].devices["cpu"] is None
    if not torch.cuda.is_available():
        assert "CUDA" in statuses["torch"].devices["cuda"]
        assert "unavailable" in str(statuses["torch"])


def test_auto_never_picks_the_oracle():
    for dtype in glai_kernels.SUPPORTED_DTYPES:
        assert registry.pick_auto("cpu", dtype).name not in ("einsum", "compile")


def test_names_are_unique_and_auto_is_reserved():
    with pytest.raises(ValueError, match="reserved or already registered"):
        registry.register(registry.get("torch"))
    with pytest.raises(ValueError, match="reserved"):
        registry.register(registry.Backend(name="auto", forward=None, backward=None,
                                           devices=("cpu",), description=""))


def test_workspace_estimates_are_element_counts():
    """Every registration's workspace estimate (None: fused) answers with a count for a
    forward and for each backward; the backends that materialise more estimate more."""
    shape = Shape(16, 33, 17, 5)
    subsets = [frozenset(g) for g in ((), ("x",), ("act",), ("weight",), ("x", "act", "weight"))]
    for backend in registry.ESTIMATOR.backends():
        for forward in (True, False):
            for grads in subsets:
                n = backend.workspace_elements(shape, forward, grads)
                assert isinstance(n, int) and n >= 0, (backend.name, forward, grads)
    einsum, torch_ = registry.get("einsum"), registry.get("torch")
    assert einsum.workspace_elements(shape, True, frozenset()) == 16 * 33 * 17  # [B, I, P]
    assert torch_.workspace_elements(shape, True, frozenset()) == 5 * 16 * 17  # Z [O, B, P]
