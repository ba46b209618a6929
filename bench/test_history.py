"""The benchmark history: records round-trip, writes are atomic even when the writer is killed,
and records stay readable as the schema grows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from bench import history
from bench.history import ROOT


def results(commit: str = "a" * 40, date: str = "2026-11-22T03:00:00+00:00",
            machine: str = "cpu-2core", speedup: float = 2.0) -> dict:
    """A small results.json as `python -m bench` writes it (two backends, one case)."""
    case = {"head": "A2", "batch": 16, "inputs": 769, "paths": 64, "outputs": 4,
            "dtype": "float32", "pass": "forward", "device": "cpu", "sweep": "heads",
            "status": "ok", "correct": True}
    return {
        "command": "python -m bench --preset quick", "baseline": "einsum",
        "provenance": {"commit": commit, "date": date, "machine": machine, "device": "cpu",
                       "device_name": "AMD EPYC", "load_average": 0.5},
        "preset": {"name": "quick"},
        "ceilings": {"matmul_flops": {"float32": 2e11}},
        "rows": [{**case, "backend": "einsum", "median_s": 2e-3, "speedup_vs_baseline": 1.0,
                  "roofline_pct": 10.0, "winner": False, "extra_column": 1},
                 {**case, "backend": "torch", "median_s": 2e-3 / speedup,
                  "speedup_vs_baseline": speedup, "roofline_pct": 10.0 * speedup,
                  "winner": True}],
    }


def test_append_then_load_round_trips(tmp_path):
    first = history.append(results(commit="1" * 40, date="2026-11-20T00:00:00+00:00"), tmp_path)
    second = history.append(results(commit="2" * 40, speedup=3.0), tmp_path)
    assert first.parent.name == "cpu-2core" and first.name.startswith("20261120T000000Z-1111")
    records = history.load(tmp_path)
    assert [r.path for r in records] == [first, second]  # oldest first
    assert records[1].commit == "2" * 40 and records[1].preset == "quick"
    torch_row = next(r for r in records[1].rows if r["backend"] == "torch")
    assert torch_row["speedup_vs_baseline"] == 3.0
    assert "extra_column" not in records[0].rows[0]  # a record keeps only ROW_FIELDS
    frame = history.frame(records)
    assert len(frame) == 4 and set(frame["commit"]) == {"1" * 40, "2" * 40}
    assert oct(first.stat().st_mode & 0o777) == oct(0o644)


def test_the_same_run_twice_makes_two_records(tmp_path):
    a, b = history.append(results(), tmp_path), history.append(results(), tmp_path)
    assert a != b and len(history.load(tmp_path)) == 2


def test_load_filters_by_machine_and_rejects_foreign_files(tmp_path):
    history.append(results(machine="cpu-2core"), tmp_path)
    history.append(results(machine="cuda-NVIDIA-H100"), tmp_path)
    assert [r.machine for r in history.load(tmp_path, machine="cuda-NVIDIA-H100")] == [
        "cuda-NVIDIA-H100"]
    (tmp_path / "cpu-2core" / "notes.json").write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match=r"notes\.json is not a glai-kernels history record"):
        history.load(tmp_path)


def test_a_failed_write_leaves_the_history_as_it_was(tmp_path, monkeypatch):
    kept = history.append(results(), tmp_path)
    before = kept.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(history.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        history.append(results(commit="b" * 40), tmp_path)
    assert sorted(p.name for p in (tmp_path / "cpu-2core").iterdir()) == [kept.name]
    assert kept.read_bytes() == before


def test_a_writer_killed_midway_leaves_the_history_intact(tmp_path):
    """SIGKILL after the new record's bytes are written but before the rename."""
    kept = history.append(results(), tmp_path)
    script = textwrap.dedent(f"""
        import os, signal
        from bench import history
        from bench.test_history import results
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        history.append(results(commit="c" * 40), history.Path({str(tmp_path)!r}))
    """)
    # `python -c` puts its working directory first on sys.path: the repository, for `bench`
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == -9, proc.stderr.decode()
    leftovers = [p.name for p in (tmp_path / "cpu-2core").iterdir()]
    assert any(n.startswith(".tmp-") for n in leftovers)  # the killed write's partial file
    records = history.load(tmp_path)
    assert [r.path for r in records] == [kept]


def test_older_rows_missing_newer_fields_still_load(tmp_path):
    raw = history.make_record(results())
    for row in raw["rows"]:
        del row["roofline_pct"], row["energy_j"]
    del raw["command"]
    path = tmp_path / "cpu-2core" / "old.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    [record] = history.load(tmp_path)
    assert record.rows[0]["roofline_pct"] is None and record.command == ""
    assert history.frame([record])["roofline_pct"].isna().all()


def test_a_schema_bump_reads_old_records_through_its_upgrade(tmp_path, monkeypatch):
    """What a future schema would do: rename a field, and upgrade older files on load."""
    old = history.append(results(speedup=4.0), tmp_path)  # written at the current schema
    now = history.SCHEMA

    def rename_speedup(raw: dict) -> dict:
        rows = [{**{k: v for k, v in r.items() if k != "speedup_vs_baseline"},
                 "speedup": r["speedup_vs_baseline"]} for r in raw["rows"]]
        return {**raw, "rows": rows, "schema": now + 1}

    monkeypatch.setattr(history, "SCHEMA", now + 1)
    monkeypatch.setattr(history, "_UPGRADES", {**history._UPGRADES, now: rename_speedup})
    monkeypatch.setattr(history, "ROW_FIELDS", tuple(
        "speedup" if f == "speedup_vs_baseline" else f for f in history.ROW_FIELDS))
    [record] = history.load(tmp_path)
    assert record.path == old
    assert next(r for r in record.rows if r["backend"] == "torch")["speedup"] == 4.0


def test_a_schema_1_record_reads_as_timed_against_einsum(tmp_path):
    """Schema 1 hard-wired einsum as the baseline and called its speedup speedup_vs_einsum."""
    raw = history.make_record(results(speedup=4.0))
    del raw["baseline"]
    raw["schema"] = 1
    raw["rows"] = [{("speedup_vs_einsum" if k == "speedup_vs_baseline" else k): v
                    for k, v in row.items()} for row in raw["rows"]]
    path = tmp_path / "cpu-2core" / "old.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    [record] = history.load(tmp_path)
    assert record.baseline == "einsum"
    torch_row = next(r for r in record.rows if r["backend"] == "torch")
    assert torch_row["speedup_vs_baseline"] == 4.0 and "speedup_vs_einsum" not in torch_row


def test_a_record_newer_than_the_code_is_skipped_with_a_warning(tmp_path):
    history.append(results(), tmp_path)
    raw = history.make_record(results(commit="f" * 40))
    raw["schema"] = history.SCHEMA + 1
    (tmp_path / "cpu-2core" / "future.json").write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="newer than this code"):
        records = history.load(tmp_path)
    assert [r.commit for r in records] == ["a" * 40]


def test_the_committed_history_loads():
    """Every record under reports/history/ is readable by this code."""
    records = history.load()
    assert records, f"{history.HISTORY_DIR} should hold the committed runs"
    for record in records:
        assert record.rows and record.machine and record.commit and record.ceilings
