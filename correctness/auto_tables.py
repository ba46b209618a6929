"""Dispatch tables written for a test, and the check that `auto` follows one: shared by
test_dispatch.py (the dense op) and test_sparse_dispatch.py (the sparse op), whose `auto`
selects by one rule over their own registries and tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from glai_kernels import dispatch
from glai_kernels.dispatch import Call
from glai_kernels.registry import Registry

# the problem both suites call: B = 3 (batch bucket 4), I = 4, P = 6, O = 5 (size class 7)
TRAIN_CALL = Call("train", 3, 4, 6, 5)


def write_table(folder: Path, entries: list[dict], kind: str | None = None,
                op: str = "estimator", field_op: str | None = None) -> None:
    """`op`'s table for machine kind `kind` (this machine's by default) into `folder`, its
    "op" field `field_op` (else `op`), and the package's cache of tables cleared."""
    kind = kind or dispatch.machine_kind("cpu")
    dispatch.table_path(kind, folder, op=op).write_text(json.dumps(
        {"kind": dispatch.KIND, "schema": dispatch.SCHEMA, "machine_kind": kind,
         "op": field_op or op, "provenance": {"note": "test"}, "entries": entries}))
    dispatch.clear_cache()


def check_auto_follows_table(spies: list[str], registry: Registry,
                             estimator: Callable[[], torch.Tensor]) -> None:
    """With a table naming spy_low for `train` and spy_high for `forward` at TRAIN_CALL's
    bucket, and spy_high first by priority: a call needing gradients runs spy_low, one
    without runs spy_high, and the rule says so; without a call's shape (inside
    torch.compile, say) the priorities decide. `estimator()` makes one call of the op on
    TRAIN_CALL's sizes whose only input needing a gradient is its weight (or values)."""
    estimator().sum().backward()  # the weight alone needs a gradient: train
    assert spies == ["spy_low.forward", "spy_low.backward"]
    spies.clear()
    with torch.no_grad():
        estimator()
    assert spies == ["spy_high.forward"]
    assert registry.pick_auto("cpu", torch.float32, TRAIN_CALL).name == "spy_low"
    assert registry.auto_rule("cpu", torch.float32, TRAIN_CALL).startswith("measured")
    assert registry.pick_auto("cpu", torch.float32).name == "spy_high"
