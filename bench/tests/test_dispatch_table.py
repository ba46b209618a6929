"""The dispatch table a run writes (bench/harness/dispatch_table.py): its cells' winners, the
within-5% counts of each rule and the summary's section, on a tiny synthetic results table."""

from __future__ import annotations

import json

import pytest

from bench.harness import dispatch_table, results
from bench.harness.ceilings import Ceilings
from bench.reporting import summary
from glai_kernels import dispatch, registry


def _row(backend: str, batch: int, ms: float, pass_: str = "both", inputs: int = 384,
         status: str = "ok", correct: bool = True) -> dict:
    return {"sweep": "heads", "head": "A1", "backend": backend, "batch": batch,
            "inputs": inputs, "paths": 256, "outputs": 37, "dtype": "float32", "pass": pass_,
            "device": "cpu", "mu": None, "status": status, "correct": correct,
            "median_s": ms / 1e3, "min_s": ms / 1e3, "iqr_s": 0.0}


def _meta() -> dict:
    return {"provenance": {"device": "cpu", "threads": 2, "commit": "abc", "date": "2026",
                           "machine": "test", "device_name": "cpu"},
            "command": "glai-bench run --preset tiny", "preset": {"name": "tiny"},
            "backends": ["einsum", "torch", "cpp", "peer:einsum"]}


@pytest.fixture
def built():
    rows = [
        # B = 16: torch wins by 20%; B = 256, two shapes of one cell (inputs 384 and 385):
        # cpp wins one by 2x, loses the other by 10%, so it wins the cell
        _row("torch", 16, 1.0), _row("cpp", 16, 1.2), _row("einsum", 16, 0.5),
        _row("peer:einsum", 16, 0.1),  # neither einsum nor a peer is an auto candidate
        _row("torch", 256, 10.0), _row("cpp", 256, 5.0),
        _row("torch", 256, 10.0, inputs=385), _row("cpp", 256, 11.0, inputs=385),
        # a wrong measurement is no candidate's, however fast
        _row("cpp", 16, 0.2, pass_="forward", status="wrong", correct=False),
        _row("torch", 16, 0.3, pass_="forward"),
    ]
    df = results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})
    return dispatch_table.build(df, _meta())


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
    rows = [_row("torch", 16, 1.0), _row("cpp", 16, 2.0), _row("torch", 256, 10.0)]
    df = results.table(rows, Ceilings({"float32": 1e11}, 1e10), {})
    _, ev = dispatch_table.build(df, _meta())
    top = max(("cpp", "torch"), key=lambda n: registry.get(n).auto_priority["cpu"])
    assert ev["priorities"] == {"within": {"cpp": 1, "torch": 2}[top], "cases": 2}
