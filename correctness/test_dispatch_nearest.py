"""A machine kind with no dispatch table of its own takes the nearest measured kind's table
(issue 41, item 4; glai_kernels/dispatch/kinds.py): same instruction set and vendor, then the
same instruction set; never another instruction set or device type; and it says so."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import glai_kernels
from glai_kernels import __main__ as report
from glai_kernels import dispatch, registry
from glai_kernels.dispatch import kinds

ZEN5 = "cpu-2core-AuthenticAMD-family-26-model-2-AVX512-2t"
XEON = "cpu-2core-GenuineIntel-family-6-model-207-AVX512-2t"
ZEN4 = "cpu-2core-AuthenticAMD-family-25-model-17-AVX512-2t"  # no table of its own
H100 = "cuda-NVIDIA-H100-80GB-HBM3-sm90"
H200 = "cuda-NVIDIA-H200-sm90"


def test_parse_reads_both_forms_and_nothing_else():
    zen5 = kinds.parse(ZEN5)
    assert (zen5.device, zen5.vendor, zen5.isa, zen5.threads, zen5.cores) == (
        "cpu", "AuthenticAMD", "AVX512", 2, 2)
    h100 = kinds.parse(H100)
    assert (h100.device, h100.vendor, h100.isa) == ("cuda", "NVIDIA", "sm90")
    for other in (f"{ZEN5}.sparse_estimator", "results", "cuda-NVIDIA-H100", ""):
        assert kinds.parse(other) is None, other


@pytest.mark.parametrize(("unseen", "measured", "expected"), [
    (ZEN4, [XEON, ZEN5], ZEN5),  # same vendor and ISA first
    ("cpu-2core-GenuineIntel-family-6-model-143-AVX512-2t", [ZEN5, XEON], XEON),
    # another vendor's table, same ISA, when that is all there is
    ("cpu-2core-HygonGenuine-family-24-model-1-AVX512-2t", [XEON, ZEN5], ZEN5),
    ("cpu-4core-AuthenticAMD-family-25-model-17-AVX512-4t",  # the thread bucket decides
     ["cpu-2core-AuthenticAMD-family-26-model-2-AVX512-2t",
      "cpu-4core-AuthenticAMD-family-26-model-2-AVX512-4t"],
     "cpu-4core-AuthenticAMD-family-26-model-2-AVX512-4t"),
    ("cpu-2core-AuthenticAMD-family-23-model-49-AVX2-2t", [ZEN5, XEON], None),  # other ISA
    ("cuda-NVIDIA-H100-PCIe-sm90", [H200, H100], H100),  # the longer common name
    ("cuda-NVIDIA-GH200-480GB-sm90", [H200, H100], H100),  # a tie: the first name sorted
    ("cuda-NVIDIA-A100-SXM4-80GB-sm80", [H100, H200], None),  # other compute capability
    (ZEN4, [H100], None),  # other device type
    ("not-a-kind", [ZEN5], None),
])
def test_nearest_follows_the_rule(unseen, measured, expected):
    assert kinds.nearest(unseen, measured) == expected
    assert kinds.nearest(unseen, list(reversed(measured))) == expected  # order-free


def test_a_kind_is_never_its_own_stand_in():
    assert kinds.nearest(ZEN5, [ZEN5]) is None


def _table(kind: str, winner: str, op: str = "estimator") -> dict:
    # B = 3 -> bucket 4; O*I*P = 5*4*6 = 120 -> size class 7; no gradient: "forward"
    return {"kind": dispatch.KIND, "schema": dispatch.SCHEMA, "machine_kind": kind, "op": op,
            "provenance": {"note": "test"},
            "entries": [{"dtype": "float32", "mode": "forward", "batch_bucket": 4,
                         "size_class": 7, "winner": winner}]}


@pytest.fixture
def unseen_machine(tmp_path, monkeypatch, spy_calls) -> Path:
    """This machine is a Zen 4 without a table; $GLAI_DISPATCH_DIR is an empty folder; the
    spies are registered (spy_high is the priorities' pick)."""
    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    monkeypatch.setenv(dispatch.DIR_VAR, str(tmp_path))
    monkeypatch.setattr(dispatch, "machine_kind", lambda device_type, threads=None: ZEN4)
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _write(folder: Path, kind: str, winner: str, op: str = "estimator") -> Path:
    path = dispatch.table_path(kind, folder, op=op)
    path.write_text(json.dumps(_table(kind, winner, op)))
    return path


def _run(spy_calls: list[str]) -> str:
    x, act, weight = torch.randn(3, 4), torch.rand(3, 6), torch.randn(5, 4, 6)
    spy_calls.clear()
    glai_kernels.estimator(x, act, weight, backend="auto")
    return spy_calls[0].split(".")[0]


def test_auto_follows_the_nearest_kinds_table(unseen_machine, spy_calls):
    _write(unseen_machine, ZEN5, "spy_low")  # same vendor and ISA
    _write(unseen_machine, XEON, "spy_high")
    assert _run(spy_calls) == "spy_low"
    table = dispatch.table_for("cpu")
    assert (table.machine_kind, table.stand_in_for) == (ZEN5, ZEN4)
    call = dispatch.Call("forward", 3, 4, 6, 5)
    rule = registry.auto_rule("cpu", torch.float32, call)
    assert rule.startswith("measured") and f"nearest measured kind to {ZEN4}" in rule


def test_without_a_near_kind_auto_takes_the_priorities(unseen_machine, spy_calls):
    _write(unseen_machine, "cpu-2core-AuthenticAMD-family-23-model-49-AVX2-2t", "spy_low")
    _write(unseen_machine, H100, "spy_low")
    assert dispatch.table_for("cpu") is None and not dispatch.has_table("cpu")
    assert _run(spy_calls) == "spy_high"


def test_a_table_of_its_own_comes_first(unseen_machine, spy_calls):
    _write(unseen_machine, ZEN5, "spy_high")
    _write(unseen_machine, ZEN4, "spy_low")
    assert dispatch.table_for("cpu").stand_in_for == ""
    assert _run(spy_calls) == "spy_low"


def test_a_broken_near_table_is_passed_over_for_the_next(unseen_machine, spy_calls):
    dispatch.table_path(ZEN5, unseen_machine).write_text("{ truncated")
    _write(unseen_machine, XEON, "spy_low")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _run(spy_calls) == "spy_low"
    assert dispatch.table_for("cpu").machine_kind == XEON
    assert any(ZEN5 in str(w.message) for w in caught)


def test_another_ops_table_never_stands_in(unseen_machine, spy_calls):
    _write(unseen_machine, ZEN5, "spy_low", op="sparse_estimator")
    assert dispatch.measured_kinds() == []
    assert dispatch.measured_kinds("sparse_estimator") == [ZEN5]
    assert _run(spy_calls) == "spy_high"
    assert dispatch.table_for("cpu", op="sparse_estimator").stand_in_for == ZEN4


def test_python_m_glai_kernels_names_the_stand_in(unseen_machine, spy_calls, capsys):
    _write(unseen_machine, ZEN5, "spy_low")
    report.main()
    out = capsys.readouterr().out
    assert f"measured on {ZEN5}, the nearest measured kind to this machine's {ZEN4}" in out
    assert "same instruction set and vendor" in out
