"""The dispatch table a run writes (bench/harness/dispatch_table.py): its cells' winners, the
within-5% counts of each rule and the summary's section, on a tiny synthetic results table."""

from __future__ import annotations

import json

import pytest

from bench.harness import dispatch_table, results
from bench.harness.ceilings import Ceilings
from bench.reporting import summary
from bench.tests.helpers import run_meta, table_row
from glai_kernels import dispatch, registry

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores


@pytest.fixture
def built():
    rows = [
        # B = 16: torch wins by 20%; B = 256, two shapes of one cell (inputs 384 and 385):
        # cpp wins one by 2x, loses the other by 10%, so it wins the cell
        table_row("torch", 16, 1.0), table_row("cpp", 16, 1.2), table_row("einsum", 16, 0.5),
        table_row("peer:einsum", 16, 0.1),  # neither einsum nor a peer is an auto candidate
        table_row("torch", 256, 10.0), table_row("cpp", 256, 5.0),
        table_row("torch", 256, 10.0, inputs=385), table_row("cpp", 256, 11.0, inputs=385),
        # a wrong measurement is no candidate's, however fast
        table_row("cpp", 16, 0.2, pass_="forward", status="wrong", correct=False),
        table_row("torch", 16, 0.3, pass_="forward"),
    ]
    df = results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})
    return dispatch_table.build(df, run_meta())


def test_cells_and_winners(built):
    table, _ = built
    cells = {(e["mode"], e["batch_bucket"], e["size_class"]): e for e in table["entries"]}
    assert cells[("both", 16, 22)]["winner"] == "torch"
    big = cells[("both", 256, 22)]
    assert big["winner"] == "cpp" and big["cases"] == 2
    # geometric-mean slowdowns: cpp sqrt(1 * 1.1), torch sqrt(2 * 1)
    assert big["slowdown"]["cpp"] == pytest.approx(1.1 ** 0.5, rel=1e-3)
    assert big["slowdown"]["torch"] == pytest.approx(2 ** 0.5, rel=1e-3)
    assert cells[("forward", 16, 22)]["winner"] == "torch"
    assert {e["winner"] for e in table["entries"]} <= set(dispatch_table.candidates("cpu"))
    assert table["machine_kind"] == dispatch.machine_kind("cpu", threads=2)


def test_within_five_percent_counts(built):
    _, ev = built
    # 4 cases; the table misses inputs=385 at B = 256 (cpp 1.1x torch)
    assert ev["table"] == {"within": 3, "cases": 4}
    assert len(ev["table_misses"]) == 1 and "I=385" in ev["table_misses"][0]
    # the priorities pick whichever of cpp (20 on AVX CPUs, else 5) and torch (10) ranks first
    top = max(("cpp", "torch"), key=lambda n: registry.get(n).auto_priority["cpu"])
    assert ev["priorities"] == {"within": {"cpp": 1, "torch": 3}[top], "cases": 4}
    # held out, the forward case has no other forward case: the priorities pick for it
    assert ev["held_out"]["cases"] == 4


def test_written_table_loads_and_the_summary_reports_it(built, tmp_path):
    table, ev = built
    path = dispatch_table.write(table, tmp_path)
    loaded = dispatch.Table.from_dict(json.loads(path.read_text()), str(path))
    assert loaded.lookup("float32", dispatch.Call("both", 200, 384, 256, 37)).winner == "cpp"
    lines = "\n".join(dispatch_table.markdown({"dispatch": {**ev, "file": path.name}}))
    assert "| dispatch table (built from these cases) | 3/4 (75%) |" in lines
    assert "held out" in lines and "priorities" in lines
    assert summary._peer_lines({"peers": []}) == []


def test_the_priority_rule_is_judged_among_the_backends_timed_at_each_case():
    # cpp timed at B = 16 only (a piece of a run that timed one backend at a few shapes):
    # at B = 256 the rule's pick is among what was timed there, not a miss for cpp
    rows = [table_row("torch", 16, 1.0), table_row("cpp", 16, 2.0), table_row("torch", 256, 10.0)]
    df = results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})
    _, ev = dispatch_table.build(df, run_meta())
    top = max(("cpp", "torch"), key=lambda n: registry.get(n).auto_priority["cpu"])
    assert ev["priorities"] == {"within": {"cpp": 1, "torch": 2}[top], "cases": 2}


def _kept_row(backend: str, pass_: str, mu: float, ms: float, batch: int = 16) -> dict:
    return {**table_row(backend, batch, ms, pass_=pass_), "sweep": "kept_fraction", "mu": mu}


@pytest.fixture
def sparse_built():
    rows = [
        # the step at two kept fractions of one shape: one cell; torch wins one by 3x and
        # loses the other by 10%, so torch wins the cell (geometric-mean slowdowns: torch
        # sqrt(1.1), cpp sqrt(3))
        _kept_row("sparse:cpp", "step", 0.05, 3.0), _kept_row("sparse:torch", "step", 0.05, 1.0),
        _kept_row("sparse:cpp", "step", 0.25, 2.0), _kept_row("sparse:torch", "step", 0.25, 2.2),
        _kept_row("sparse:cpp", "forward", 0.05, 1.0),
        _kept_row("sparse:torch", "forward", 0.05, 2.0),
        # the dense op and the MLP timed beside them in the sweep: no sparse candidate
        _kept_row("cpp", "step", 0.05, 0.1), _kept_row("mlp", "step", 0.05, 0.1),
        table_row("torch", 16, 1.0),  # a heads-sweep row of the dense op
    ]
    df = results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})
    return dispatch_table.build(df, run_meta(), op=dispatch_table.SPARSE)


def test_the_sparse_table_comes_from_the_kept_sweep(sparse_built):
    table, ev = sparse_built
    assert table["op"] == "sparse_estimator"
    cells = {(e["mode"], e["batch_bucket"]): e for e in table["entries"]}
    assert set(cells) == {("train", 16), ("forward", 16)}  # "step" serves the train mode
    assert cells[("train", 16)]["winner"] == "torch" and cells[("train", 16)]["cases"] == 2
    assert cells[("forward", 16)]["winner"] == "cpp"
    assert {e["winner"] for e in table["entries"]} <= set(
        dispatch_table.candidates("cpu", dispatch_table.SPARSE))
    assert ev["op"] == "sparse_estimator" and ev["table"]["cases"] == 3
    # the dense table of the same rows sees only the heads-sweep row
    dense, _ = dispatch_table.build(results.table(
        [_kept_row("sparse:cpp", "step", 0.05, 3.0), table_row("torch", 16, 1.0)],
        Ceilings({"float32": 1e11}, 1e10), {}), run_meta())
    assert [e["winner"] for e in dense["entries"]] == ["torch"]


def test_the_sparse_op_follows_the_written_table(sparse_built, tmp_path, monkeypatch):
    table, ev = sparse_built
    path = dispatch_table.write(table, tmp_path)
    assert path.name == f"{table['machine_kind']}.sparse_estimator.json"
    lines = "\n".join(dispatch_table.markdown({"sparse_dispatch": {**ev, "file": path.name}},
                                              dispatch_table.SPARSE))
    assert "## the sparse op's auto: the measured dispatch table" in lines
    import torch

    from glai_kernels import sparse
    from glai_kernels.sparse import op as sparse_op

    monkeypatch.delenv("GLAI_BACKEND", raising=False)
    monkeypatch.setenv(dispatch.DIR_VAR, str(path.parent))
    monkeypatch.setattr(dispatch, "machine_kind", lambda *_a, **_k: table["machine_kind"])
    dispatch.clear_cache()
    try:
        weight = torch.randn(37, 384, 256)
        sw = sparse.from_dense(weight, torch.rand(weight.shape) < 0.05)
        x, act = torch.randn(16, 384), torch.rand(16, 256)
        sw.values.requires_grad_(True)
        call = sparse_op.auto_call(x, act, sw, None)
        assert call[0] == "train"
        picked = sparse_op.resolve(None, x.device, x.dtype, call).name
        top = sparse.SPARSE_ESTIMATOR.pick_by_priority("cpu", torch.float32).name
        assert picked == "torch", top  # the table's winner, whatever the priorities say
    finally:
        dispatch.clear_cache()
