"""The benchmark history: records round-trip, writes are atomic even when the writer is killed,
concurrent writers never lose a record, a bad record file is skipped with a warning naming it,
and records stay readable as the schema grows."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from bench.reporting import history
from bench.reporting.history import ROOT
from bench.tests.helpers import HISTORY_KIND as KIND
from bench.tests.helpers import MALFORMED, write_malformed
from bench.tests.helpers import history_results as results

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores


def test_append_then_load_round_trips(tmp_path):
    first = history.append(results(commit="1" * 40, date="2026-11-20T00:00:00+00:00"), tmp_path)
    second = history.append(results(commit="2" * 40, speedup=3.0), tmp_path)
    assert first.parent.name == KIND and first.name.startswith("20261120T000000Z-1111")
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
    (tmp_path / KIND / "notes.json").write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match=r"notes\.json is not a glai-kernels history record"):
        history.load(tmp_path)


@pytest.mark.parametrize("step", ["link", "fsync"])
def test_a_failed_write_leaves_the_history_as_it_was(tmp_path, monkeypatch, step):
    """`append` publishes a record by hard-linking its finished temporary file (`os.link`)."""
    kept = history.append(results(), tmp_path)
    before = kept.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(history.os, step, fail)
    with pytest.raises(OSError, match="disk full"):
        history.append(results(commit="b" * 40), tmp_path)
    assert sorted(p.name for p in (tmp_path / KIND).iterdir()) == [kept.name]
    assert kept.read_bytes() == before


def test_a_failed_replace_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """`write_atomic` (the dashboard, the gate's files) replaces a file whole or not at all."""
    path = tmp_path / "page.html"
    history.write_atomic(path, "old")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(history.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        history.write_atomic(path, "new")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert path.read_text() == "old"


def test_without_hard_links_an_exclusive_create_takes_the_name(tmp_path, monkeypatch):
    def no_links(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(history.os, "link", no_links)
    a, b = history.append(results(), tmp_path), history.append(results(), tmp_path)
    assert a != b and b.name.endswith("-2.json")
    assert {r.path for r in history.load(tmp_path)} == {a, b}
    assert not [p for p in a.parent.iterdir() if p.name.startswith(".tmp-")]


def _append_many(folder: str, n: int, barrier) -> None:
    barrier.wait(timeout=60)  # all writers start together, so their appends collide
    for _ in range(n):
        history.append(results(), Path(folder))


@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_writers_never_lose_a_record(tmp_path, writers):
    """`writers` processes x 10 appends of the same run (same second, commit and preset),
    five times: every record is kept, under its own name."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)  # fork: no re-import per writer
    for trial in range(5):
        folder = tmp_path / f"trial{trial}"
        barrier = ctx.Barrier(writers)
        procs = [ctx.Process(target=_append_many, args=(str(folder), 10, barrier))
                 for _ in range(writers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * writers
        files = sorted(p.name for p in (folder / KIND).iterdir())
        assert len(files) == writers * 10, f"trial {trial}: {len(files)} records: {files}"
        assert len(history.load(folder)) == writers * 10


def test_a_writer_killed_midway_leaves_the_history_intact(tmp_path):
    """SIGKILL after the new record's bytes are written but before the rename."""
    kept = history.append(results(), tmp_path)
    script = textwrap.dedent(f"""
        import os, signal
        from bench.reporting import history
        from bench.tests.helpers import history_results as results
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        history.append(results(commit="c" * 40), history.Path({str(tmp_path)!r}))
    """)
    # `python -c` puts its working directory first on sys.path: the repository, for `bench`
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == -9, proc.stderr.decode()
    leftovers = [p.name for p in (tmp_path / KIND).iterdir()]
    assert any(n.startswith(".tmp-") for n in leftovers)  # the killed write's partial file
    records = history.load(tmp_path)
    assert [r.path for r in records] == [kept]


def test_older_rows_missing_newer_fields_still_load(tmp_path):
    raw = history.make_record(results())
    for row in raw["rows"]:
        del row["roofline_pct"], row["energy_j"]
    del raw["command"]
    path = tmp_path / KIND / "old.json"
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
    path = tmp_path / KIND / "old.json"
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
    (tmp_path / KIND / "future.json").write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="newer than this code"):
        records = history.load(tmp_path)
    assert [r.commit for r in records] == ["a" * 40]


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_record_is_skipped_with_a_warning_naming_it(tmp_path, case):
    good = [history.append(results(commit=c * 40), tmp_path) for c in "12"]
    bad = write_malformed(tmp_path, case)
    with pytest.warns(history.HistoryWarning) as caught:
        records = history.load(tmp_path)
    assert [r.path for r in records] == good
    [warning] = caught
    message = str(warning.message)
    assert str(bad) in message and "skipped" in message
    assert re.search(MALFORMED[case][1], message), message


def test_python_m_bench_goes_on_past_a_bad_history(tmp_path, monkeypatch, capsys):
    """After the kernel suite, `python -m bench` records the run and renders the dashboard
    from the history; a malformed record there is skipped with a warning, a foreign file is
    reported, and neither stops the run."""
    from bench import __main__ as cli
    from bench.harness import suite
    from bench.reporting import dashboard

    hist, page = tmp_path / "history", tmp_path / "dashboard" / "index.html"
    kept = history.append(results(commit="1" * 40), hist)
    bad = write_malformed(hist, "truncated")

    def fake_run(preset, *, out_dir, **kwargs):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(results(commit="2" * 40)))
        return types.SimpleNamespace(table=[None], files=[], meta={})  # as RunOutput

    monkeypatch.setattr(suite, "run", fake_run)
    monkeypatch.setattr(history, "HISTORY_DIR", hist)
    monkeypatch.setattr(dashboard, "OUT", page)
    argv = ["--suite", "kernels", "--device", "cpu", "--out", str(tmp_path / "k"),
            "--history", str(hist)]
    with pytest.warns(history.HistoryWarning, match=re.escape(str(bad))):
        assert cli.main(argv) == 0
    assert "2 recorded runs" in page.read_text()
    with pytest.warns(history.HistoryWarning):
        assert kept.exists() and len(history.load(hist)) == 2

    (hist / KIND / "notes.json").write_text('{"kind": "something else"}')
    with pytest.warns(history.HistoryWarning):
        assert cli.main(argv) == 0
    assert "notes.json is not a glai-kernels history record" in capsys.readouterr().err
    assert len(list((hist / KIND).glob("*-quick*.json"))) == 3  # recorded anyway


def test_the_committed_history_loads():
    """Every record under reports/history/ is readable by this code."""
    records = history.load()
    assert records, f"{history.HISTORY_DIR} should hold the committed runs"
    for record in records:
        assert record.rows and record.machine and record.commit and record.ceilings


def test_two_cpus_behind_one_label_are_two_machines(tmp_path):
    other = results(commit="2" * 40)
    other["provenance"]["cpu_id"] = "OtherCPU family 2 model 3"
    mine, theirs = history.append(results(commit="1" * 40), tmp_path), history.append(other,
                                                                                  tmp_path)
    assert mine.parent.name == KIND and theirs.parent.name == "cpu-2core-OtherCPU-family-2-model-3"
    # a record written before machine kinds named the label alone: it reads as its kind
    raw = json.loads(mine.read_text())
    raw["machine"] = "cpu-2core"
    old = tmp_path / "cpu-2core" / "old.json"
    old.parent.mkdir()
    old.write_text(json.dumps(raw))
    assert history.read(old).machine == KIND
    assert sorted(r.machine for r in history.load(tmp_path)) == [
        "cpu-2core-OtherCPU-family-2-model-3", KIND, KIND]
