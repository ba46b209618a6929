"""The registries' remembered answers (`Registry.resolve`): an op call asks which backend runs
on every call, so the answer is kept per (the name asked for, $GLAI_BACKEND's value, device,
dtype, "auto"'s call shape), and forgotten whenever what it was read from changes: the
environment, the registered backends, their availability, the dispatch tables."""

from __future__ import annotations

import os

import pytest
import torch
from spy_backends import spy_backend

from glai_kernels import dispatch, registry
from glai_kernels.registry import ESTIMATOR, environment_backend
from glai_kernels.sparse import op as sparse_op
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR

CPU = torch.device("cpu")


@pytest.fixture
def spies(spy_calls, tmp_path, monkeypatch):
    """spy_high and spy_low registered (conftest.py), no dispatch table, no $GLAI_BACKEND."""
    monkeypatch.setattr(dispatch, "TABLE_DIR", tmp_path)
    dispatch.clear_cache()
    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    return spy_calls


def test_an_answer_is_kept_while_nothing_changes(spies, monkeypatch):
    assert ESTIMATOR.resolved(None, CPU, torch.float32) is None
    asked = []
    pick = ESTIMATOR.pick_auto
    monkeypatch.setattr(ESTIMATOR, "pick_auto", lambda *a: asked.append(a) or pick(*a))
    first = ESTIMATOR.resolve(None, CPU, torch.float32)
    assert first.name == "spy_high" and len(asked) == 1
    assert ESTIMATOR.resolve(None, CPU, torch.float32) is first and len(asked) == 1
    assert ESTIMATOR.resolved(None, CPU, torch.float32) is first
    # another dtype or name is another question
    assert ESTIMATOR.resolved(None, CPU, torch.float64) is None
    assert ESTIMATOR.resolved("spy_low", CPU, torch.float32) is None


def test_the_environment_changes_the_answer(spies, monkeypatch):
    assert ESTIMATOR.resolve(None, CPU, torch.float32).name == "spy_high"
    monkeypatch.setenv("GLAI_BACKEND", "spy_low")
    assert ESTIMATOR.resolve(None, CPU, torch.float32).name == "spy_low"
    monkeypatch.setenv("GLAI_BACKEND", "no_such_backend")
    with pytest.raises(ValueError, match="GLAI_BACKEND"):
        ESTIMATOR.resolve(None, CPU, torch.float32)
    monkeypatch.delenv("GLAI_BACKEND")
    assert ESTIMATOR.resolve(None, CPU, torch.float32).name == "spy_high"


def test_registering_replacing_or_removing_a_backend_forgets_the_answers(spies):
    assert ESTIMATOR.resolve("auto", CPU, torch.float32).name == "spy_high"
    registry.register(spy_backend("spy_top", 3_000, spies))
    try:
        assert ESTIMATOR.resolve("auto", CPU, torch.float32).name == "spy_top"
        slowed = spy_backend("spy_top", 3_000, spies)
        registry.replace(slowed)
        assert ESTIMATOR.resolve("auto", CPU, torch.float32) is slowed
    finally:
        registry.unregister("spy_top")
    assert ESTIMATOR.resolve("auto", CPU, torch.float32).name == "spy_high"


def test_clearing_the_dispatch_tables_forgets_the_answers(spies):
    ESTIMATOR.resolve(None, CPU, torch.float32)
    SPARSE_ESTIMATOR.resolve(None, CPU, torch.float32)
    dispatch.clear_cache()
    assert ESTIMATOR.resolved(None, CPU, torch.float32) is None
    assert SPARSE_ESTIMATOR.resolved(None, CPU, torch.float32) is None


def test_a_refusal_is_never_kept(spies):
    for _ in range(2):  # a backend that cannot run these tensors raises every time
        with pytest.raises(RuntimeError, match="cannot run"):
            ESTIMATOR.resolve("spy_low", torch.device("meta"), torch.float32)
    assert ESTIMATOR.resolved("spy_low", torch.device("meta"), torch.float32) is None


def test_the_sparse_op_keeps_its_own_error_for_a_dense_only_name(spies, monkeypatch):
    assert sparse_op.resolve(None, CPU, torch.float32).name in SPARSE_ESTIMATOR.names()
    monkeypatch.setenv("GLAI_BACKEND", "spy_low")  # a dense backend only
    for _ in range(2):
        with pytest.raises(ValueError, match="names no sparse estimator backend"):
            sparse_op.resolve(None, CPU, torch.float32)
    monkeypatch.setenv("GLAI_BACKEND", "torch")
    assert sparse_op.resolve(None, CPU, torch.float32).name == "torch"


def test_the_environment_is_read_as_os_environ_has_it(monkeypatch):
    monkeypatch.setenv("GLAI_BACKEND", "torch")
    assert environment_backend() == "torch"
    monkeypatch.delenv("GLAI_BACKEND")
    assert environment_backend() == ""
    # a replaced mapping (not CPython's os._Environ) is read through its own get
    monkeypatch.setattr(os, "environ", {"GLAI_BACKEND": "einsum"})
    assert environment_backend() == "einsum"


def test_torch_compile_resolves_every_time(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert ESTIMATOR._resolve_key(None, CPU, torch.float32, None) is None
