"""The sparse op's `auto` selects as the dense op's does: the machine's sparse dispatch table
(`<machine kind>.sparse_estimator.json`) where it has an entry, the priorities elsewhere; a
dense table never steers it."""

from __future__ import annotations

import pytest
import torch
from auto_tables import check_auto_follows_table, write_table

from glai_kernels import dispatch, sparse
from glai_kernels.dispatch import Call
from glai_kernels.registry import Backend
from glai_kernels.sparse import SPARSE_ESTIMATOR

OP = SPARSE_ESTIMATOR.op  # "sparse_estimator"


@pytest.fixture
def spies(monkeypatch):
    """Two sparse CPU backends that record their calls and compute as the sparse `torch`
    backend: spy_high outranks spy_low (and every shipped backend) by priority."""
    calls: list[str] = []
    plain = SPARSE_ESTIMATOR.get("torch")

    def spy(name: str, priority: int) -> Backend:
        def forward(*args):
            calls.append(f"{name}.forward")
            return plain.forward(*args)

        def backward(*args, **kwargs):
            calls.append(f"{name}.backward")
            return plain.backward(*args, **kwargs)

        return Backend(name=name, forward=forward, backward=backward, devices=("cpu",),
                       description="test spy", auto_priority={"cpu": priority})

    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    SPARSE_ESTIMATOR.register(spy("spy_low", 1_000))
    SPARSE_ESTIMATOR.register(spy("spy_high", 2_000))
    yield calls
    SPARSE_ESTIMATOR.unregister("spy_low")
    SPARSE_ESTIMATOR.unregister("spy_high")
    dispatch.clear_cache()


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    """A folder the package reads its tables from; `write(entries, op=..., field_op=...)`
    puts `op`'s table for this machine kind there, its "op" field `field_op` (else `op`)."""
    monkeypatch.setattr(dispatch, "TABLE_DIR", tmp_path)
    dispatch.clear_cache()

    def write(entries: list[dict], op: str = OP, field_op: str | None = None) -> None:
        write_table(tmp_path, entries, op=op, field_op=field_op)

    yield write
    dispatch.clear_cache()


def _entry(winner: str, mode: str) -> dict:
    # B = 3: batch bucket 4; O*I*P = 5*4*6 = 120 elements: size class 7
    return {"dtype": "float32", "mode": mode, "batch_bucket": 4, "size_class": 7,
            "winner": winner}


def _args():
    """x [3, 4], act [3, 6] and a kept-path weight (5, 4, 6) whose values require grad."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(5, 4, 6, generator=gen)
    sw = sparse.from_dense(weight, torch.rand(5, 4, 6, generator=gen) < 0.5)
    sw.values.requires_grad_(True)
    return torch.randn(3, 4, generator=gen), torch.rand(3, 6, generator=gen), sw


def test_the_sparse_table_is_named_per_op():
    kind = dispatch.machine_kind("cpu")
    assert dispatch.table_path(kind).name == f"{kind}.json"
    assert dispatch.table_path(kind, op=OP).name == f"{kind}.sparse_estimator.json"


def test_sparse_auto_follows_its_table(spies, table_dir):
    table_dir([_entry("spy_low", "train"), _entry("spy_high", "forward")])
    assert dispatch.has_table("cpu", OP)
    check_auto_follows_table(spies, SPARSE_ESTIMATOR, lambda: sparse.estimator(*_args()))


def test_without_a_sparse_table_the_priorities_decide(spies, table_dir):
    assert not dispatch.has_table("cpu", OP)
    sparse.estimator(*_args()).sum().backward()
    assert spies == ["spy_high.forward", "spy_high.backward"]
    rule = SPARSE_ESTIMATOR.auto_rule("cpu", torch.float32, Call("train", 3, 4, 6, 5))
    assert rule.startswith("priorities (no dispatch table for ")


def test_a_dense_table_does_not_steer_the_sparse_op(spies, table_dir):
    table_dir([_entry("spy_low", "train")], op="estimator")  # <kind>.json, the dense op's
    assert dispatch.has_table("cpu") and not dispatch.has_table("cpu", OP)
    sparse.estimator(*_args()).sum().backward()
    assert spies == ["spy_high.forward", "spy_high.backward"]


def test_a_table_of_another_op_under_the_sparse_name_is_not_used(spies, table_dir):
    table_dir([_entry("spy_low", "train")], field_op="estimator")
    assert not dispatch.has_table("cpu", OP)
    sparse.estimator(*_args()).sum().backward()
    assert spies == ["spy_high.forward", "spy_high.backward"]


def test_a_sparse_table_does_not_steer_the_dense_op(spies, table_dir):
    table_dir([_entry("spy_low", "train")])
    assert not dispatch.has_table("cpu")
    assert dispatch.measured_pick("estimator", "cpu", torch.float32,
                                  Call("train", 3, 4, 6, 5))[0] is None
