"""A broken dispatch table never breaks `auto` (issue 40, item 3): whatever is wrong with the
machine's table file, a dense `auto` call runs, warns once naming the file and the reason,
and takes the priorities' pick; $GLAI_DISPATCH_DIR steers which folder is read."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import glai_kernels
from glai_kernels import dispatch, registry


@pytest.fixture
def spies(spy_calls, monkeypatch):
    """spy_high outranks spy_low by priority (conftest.py's spy_calls); every table below
    names spy_low, so a run on spy_high is the priorities' pick."""
    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    return spy_calls


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """An empty folder that $GLAI_DISPATCH_DIR points at."""
    monkeypatch.setenv(dispatch.DIR_VAR, str(tmp_path))
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _entry(**changes) -> dict:
    # B = 3 -> bucket 4; O*I*P = 5*4*6 = 120 -> size class 7; no gradient: "forward"
    return {"dtype": "float32", "mode": "forward", "batch_bucket": 4, "size_class": 7,
            "winner": "spy_low", **changes}


def _table(**changes) -> dict:
    return {"kind": dispatch.KIND, "schema": dispatch.SCHEMA,
            "machine_kind": dispatch.machine_kind("cpu"), "op": "estimator",
            "provenance": {"note": "test"}, "entries": [_entry()], **changes}


def _without(data: dict, name: str) -> dict:
    return {k: v for k, v in data.items() if k != name}


def _path(folder: Path) -> Path:
    return dispatch.table_path(dispatch.machine_kind("cpu"), folder)


def _args():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(3, 4, generator=gen), torch.randn(3, 6, generator=gen),
            torch.randn(5, 4, 6, generator=gen))


def _run_auto(calls: list[str]) -> tuple[torch.Tensor, list[warnings.WarningMessage]]:
    """Two auto calls without gradients; (the first's y, the warnings they raised)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            y = glai_kernels.estimator(*_args())
            glai_kernels.estimator(*_args())
    return y, list(caught)


BROKEN = {
    "truncated": lambda: json.dumps(_table())[:60],
    "empty": lambda: "",
    "not-an-object": lambda: json.dumps([_table()]),
    "winner-an-int": lambda: json.dumps(_table(entries=[_entry(winner=3)])),
    "bucket-a-string": lambda: json.dumps(_table(entries=[_entry(batch_bucket="4")])),
    "bucket-zero": lambda: json.dumps(_table(entries=[_entry(batch_bucket=0)])),
    "size-negative": lambda: json.dumps(_table(entries=[_entry(size_class=-1)])),
    "size-nan": lambda: json.dumps(_table(entries=[_entry(size_class=math.nan)])),
    "size-a-bool": lambda: json.dumps(_table(entries=[_entry(size_class=True)])),
    "mode-unknown": lambda: json.dumps(_table(entries=[_entry(mode="sideways")])),
    "entry-missing-winner": lambda: json.dumps(_table(entries=[_without(_entry(), "winner")])),
    "entry-not-an-object": lambda: json.dumps(_table(entries=["spy_low"])),
    "no-entries": lambda: json.dumps(_without(_table(), "entries")),
    "entries-an-object": lambda: json.dumps(_table(entries={"0": _entry()})),
    "no-machine-kind": lambda: json.dumps(_without(_table(), "machine_kind")),
    "provenance-a-list": lambda: json.dumps(_table(provenance=[])),
    "schema-unknown": lambda: json.dumps(_table(schema=dispatch.SCHEMA + 1)),
    "schema-a-string": lambda: json.dumps(_table(schema=str(dispatch.SCHEMA))),
    "wrong-kind": lambda: json.dumps(_table(kind="some-other-file")),
    "not-utf8": lambda: b"\xff\xfe\x00{",
}
# what each warning says is wrong (besides the file's path)
REASONS = {
    "truncated": "JSONDecodeError", "empty": "JSONDecodeError", "not-an-object": "array",
    "winner-an-int": "winner", "bucket-a-string": "batch_bucket", "bucket-zero": "batch_bucket",
    "size-negative": "size_class", "size-nan": "size_class", "size-a-bool": "size_class",
    "mode-unknown": "mode", "entry-missing-winner": "winner",
    "entry-not-an-object": "entries[0]", "no-entries": "entries",
    "entries-an-object": "entries", "no-machine-kind": "machine_kind",
    "provenance-a-list": "provenance", "schema-unknown": "schema",
    "schema-a-string": "schema", "wrong-kind": "kind", "not-utf8": "UnicodeDecodeError",
}


def test_the_well_formed_table_decides(spies, folder):
    """The control: the same table, well formed, makes auto run spy_low with no warning."""
    _path(folder).write_text(json.dumps(_table()))
    _, caught = _run_auto(spies)
    assert spies == ["spy_low.forward"] * 2 and not caught


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_table_warns_once_and_falls_back_to_priorities(spies, folder, case):
    text = BROKEN[case]()
    path = _path(folder)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    y, caught = _run_auto(spies)
    ours = [w for w in caught if str(path) in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert REASONS[case] in str(ours[0].message), str(ours[0].message)
    assert spies == ["spy_high.forward"] * 2
    priority = registry.pick_auto("cpu", torch.float32).name
    assert priority == "spy_high"
    torch.testing.assert_close(y, glai_kernels.estimator(*_args(), backend=priority),
                               rtol=0, atol=0)


def test_a_folder_in_place_of_the_table_warns_once_and_falls_back(spies, folder):
    path = _path(folder)
    path.mkdir()
    _, caught = _run_auto(spies)
    ours = [w for w in caught if str(path) in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert spies == ["spy_high.forward"] * 2


def test_the_variable_steers_the_lookup(spies, tmp_path, monkeypatch):
    """Two folders whose tables name different winners: the one $GLAI_DISPATCH_DIR names
    decides; unset, the shipped folder is read."""
    first, second = tmp_path / "first", tmp_path / "second"
    for where, winner in ((first, "spy_low"), (second, "spy_high")):
        where.mkdir()
        _path(where).write_text(json.dumps(_table(entries=[_entry(winner=winner)])))
    for where, winner in ((first, "spy_low"), (second, "spy_high"), (first, "spy_low")):
        monkeypatch.setenv(dispatch.DIR_VAR, str(where))
        dispatch.clear_cache()
        assert dispatch.table_dir() == where
        assert dispatch.table_for("cpu").source == str(_path(where))
        spies.clear()
        _run_auto(spies)
        assert spies == [f"{winner}.forward"] * 2
    monkeypatch.delenv(dispatch.DIR_VAR)
    dispatch.clear_cache()
    assert dispatch.table_dir() == dispatch.TABLE_DIR
    monkeypatch.setenv(dispatch.DIR_VAR, "")  # set but empty: the shipped folder too
    assert dispatch.table_dir() == dispatch.TABLE_DIR


def test_an_empty_folder_means_no_table(spies, folder):
    assert dispatch.table_for("cpu") is None
    _, caught = _run_auto(spies)
    assert spies == ["spy_high.forward"] * 2 and not caught
