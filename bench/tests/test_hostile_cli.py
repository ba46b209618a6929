"""No `glai-bench` command ends in a traceback (issue 40, item 7).

Every command gets hostile arguments (zero, negative and non-numeric numbers, missing files,
a file where a folder is expected, garbage JSON and CSV, empty folders) and must answer with
a message naming the argument or the file and a non-zero exit status: argparse's
(`prog: error: argument --threads: ...`, exit 2) for a bad argument, the command's own for a
bad file. Nothing here measures anything: each case fails before timing, or reads tiny
fixtures. Most run in this process through `bench.__main__.main`; two go through
`python -m bench` to prove the real entry point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from bench import __main__ as bench_main
from bench.harness.ceilings import Ceilings
from bench.reporting import history, render, summary
from bench.tests.helpers import HISTORY_KIND, fake_run, history_results, write_run
from bench.tests.helpers import table_row as _row

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

ROOT = Path(__file__).resolve().parents[2]
# the gate's machine kind of helpers.fake_run's results
GATE_KIND = "cpu-2core-TestCPU-family-1-model-1"


def call(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stdout + stderr) of `glai-bench ARGV`, asserting no traceback."""
    try:
        code = bench_main.main(argv)
    except SystemExit as e:  # argparse's errors exit 2 from inside main
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out + err


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


@pytest.fixture
def garbage_run(tmp_path) -> Path:
    """A folder with a results.csv and results.json that are neither."""
    run = tmp_path / "garbage"
    run.mkdir()
    (run / "results.json").write_text("{ this is not json")
    (run / "results.csv").write_bytes(b"\x00\xff garbage \x01\n\"unclosed")
    return run


# (argv, what the message must say); each is an argparse error, exit 2, before any timing
BAD_ARGUMENTS = [
    (["run", "--threads", "0"], "argument --threads: must be a positive integer, got '0'"),
    (["run", "--threads", "-2"], "argument --threads: must be a positive integer"),
    (["run", "--threads", "two"], "argument --threads: must be a positive integer"),
    (["run", "--rounds", "0"], "argument --rounds: must be a positive integer"),
    (["run", "--min-time", "0"], "argument --min-time: must be a positive number"),
    (["run", "--max-call", "-1"], "argument --max-call: must be a positive number"),
    (["run", "--time-limit", "nan"], "argument --time-limit: must be a positive number"),
    (["run", "--energy-window", "-0.5"], "argument --energy-window: must be a non-negative"),
    (["run", "--batches", "16,0"], "argument --batches: must be comma-separated positive"),
    (["--batches", "x"], "argument --batches: must be comma-separated positive"),
    (["pipeline", "--seeds", "0"], "argument --seeds: must be a positive integer"),
    (["pipeline", "--threads", "-1"], "argument --threads: must be a non-negative integer"),
    (["pipeline", "--jobs", "0"], "argument --jobs: must be a positive integer"),
    (["pipeline", "--heads", "A1,Z9"], "argument --heads: expected comma-separated paper"),
    (["pipeline", "--data", "A1"], "argument --data: expected HEAD=FILE"),
    (["pipeline", "--data", "Z9=x.npz"], "argument --data: unknown head 'Z9'"),
    (["pipeline", "--data", "A1=/no/such/file.npz"], "argument --data: no such file"),
    (["gate", "check", "--confirm", "-1"], "argument --confirm: must be a non-negative"),
    (["gate", "check", "--plant", "torch"], "argument --plant: expected BACKEND=FACTOR"),
    (["gate", "check", "--plant", "torch=0.5"], "argument --plant: FACTOR must be a slowdown"),
    (["gate", "check", "--plant", "nope=2"], "argument --plant: unknown"),
    (["gate", "check", "--preset", "bogus"], "argument --preset: invalid choice"),
    (["gate", "check", "--results", "/no/such/results.json"], "argument --results: no such"),
    (["gate", "check", "--baseline-dir", "/no/such/folder"],
     "argument --baseline-dir: no such folder"),
    (["gate", "accept", "--runs", "1"], "argument --runs: must be an integer of at least 3"),
    (["gate", "accept", "--margin", "0"], "argument --margin: must be a positive number"),
    (["gate", "accept", "--case-floor", "-0.1"], "argument --case-floor: must be a non-neg"),
    (["dashboard", "--history", "/no/such/history"], "argument --history: no such folder"),
    (["render", "/no/such/run"], "argument out_dir: no such folder"),
    (["merge", "/tmp/merged", "/no/such/run"], "argument runs: no such folder"),
    (["cpu-targets", "--rounds", "0"], "argument --rounds: must be a positive integer"),
    (["kernel-peak", "--batches", "256,-1"], "argument --batches: must be comma-separated"),
    (["kernel-peak", "--threads", "0"], "argument --threads: must be comma-separated"),
    (["kernel-peak", "--target", "0"], "argument --target: must be a positive number"),
    (["sparse-cpp-timing", "--mu", "0"], "argument --mu: must be a number in (0, 1]"),
    (["sparse-cpp-timing", "--repeats", "0"], "argument --repeats: must be a positive"),
    (["sparse-crossover", "--mus", "0"], "argument --mus: must be a percentage"),
    (["sparse-crossover", "--heads", "Z9"], "argument --heads: invalid choice: 'Z9'"),
    (["sparse-torch-candidates", "--batches", "0"], "argument --batches: must be a positive"),
    (["sparse-train-step", "--threads", "0"], "argument --threads: must be a positive"),
    (["sparse-train-step", "--backend", "nope"], "argument --backend: unknown"),
    (["sparse-train-step", "--beside", "-1"], "argument --beside: must be a non-negative"),
    (["sparse-kernels-floor", "--ghz", "-1"], "argument --ghz: must be a positive number"),
    (["sparse-kernels-floor", "--heads", "Z9"], "argument --heads: invalid choice: 'Z9'"),
    (["step-anatomy", "--rounds", "0"], "argument --rounds: must be a positive integer"),
    (["step-anatomy", "--heads", "Z9"], "argument --heads: invalid choice: 'Z9'"),
    (["call-anatomy", "--batch", "0"], "argument --batch: must be a positive integer"),
    (["call-anatomy", "--heads", "Z9"], "argument --heads: invalid choice: 'Z9'"),
    (["dispatch-overhead", "--rounds", "3"], "unrecognized arguments: --rounds 3"),
    (["predict", "--out", "x"], "unrecognized arguments: --out x"),
    (["holdout", "--hold", "0"], "argument --hold: must be a positive integer"),
    (["holdout", "--factor", "-1"], "argument --factor: must be a positive number"),
    (["holdout", "/no/such/baseline.json"], "argument baseline: no such file"),
    (["check-cuda", "--arch", "sm_eighty"], "argument --arch: must be a compute capability"),
    (["run", "--matmul-precision", "tf32"], "argument --matmul-precision: invalid choice"),
    (["run", "--matmul-precision", "high", "--install-dispatch"],
     "argument --install-dispatch: not with --matmul-precision high"),
    (["check-headers", "--include", "/no/such/include"], "argument --include: no such folder"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS,
                         ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_an_argparse_error(argv, message, capsys):
    code, text = call(argv, capsys)
    assert code == 2
    assert message in text, text


@pytest.mark.parametrize("argv", [
    ["run", "--out", "{file}/sub"], ["run", "--out", "{file}"],
    ["run", "--history", "{file}/deeper/history"], ["run", "--pipeline-out", "{file}/p"],
    ["pipeline", "--out", "{file}/p"], ["gate", "check", "--save", "{file}/runs"],
    ["gate", "accept", "--baseline-dir", "{file}/b"], ["gate", "measure", "--out", "{file}/r.json"],
    ["dashboard", "--out", "{file}/index.html"], ["render", "{file}"],
    ["merge", "{file}/merged", "{tmp}"], ["call-anatomy", "--out", "{file}/a.json"],
], ids=lambda argv: " ".join(argv[:2]))
def test_a_path_under_a_file_is_refused_naming_it(argv, a_file, capsys):
    argv = [a.format(file=a_file, tmp=a_file.parent) for a in argv]
    code, text = call(argv, capsys)
    assert code == 2
    assert "error: argument" in text and str(a_file) in text, text


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--dtypes", "float32,float99", "unknown dtype 'float99'"),
    ("--passes", "sideways", "unknown pass 'sideways'"),
    ("--heads", "Z9", "unknown head 'Z9'"),
    ("--sweeps", "nowhere", "unknown sweep 'nowhere'"),
])
def test_run_names_an_unknown_case_before_timing(tmp_path, option, value, message, capsys):
    code, text = call(["run", "--suite", "kernels", "--device", "cpu", "--no-history",
                       "--out", str(tmp_path / "out"), option, value], capsys)
    assert code == 2 and f"glai-bench run: error: {message}" in text, text
    assert not (tmp_path / "out").exists()


def test_pipeline_names_a_data_file_that_is_not_embeddings(tmp_path, capsys):
    bad = tmp_path / "a1.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    code, text = call(["pipeline", "--data", f"A1={bad}"], capsys)
    assert code == 2 and "argument --data" in text and f"{bad}: not readable embeddings" in text


# gate check and accept over bad files: the file is named, exit 2, nothing compared


def _results_file(tmp_path: Path, name: str = "results.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(fake_run(np.random.default_rng(0), 0.01)))
    return path


@pytest.mark.parametrize(("text", "reason"), [
    ("{ truncated", "not readable as JSON"),
    ("[1, 2]", "is a JSON list, expected an object"),
    ('{"provenance": {"machine": 3}, "rows": []}', "provenance.machine is missing"),
    ('{"provenance": {"machine": "cpu"}, "rows": [{"backend": "torch"}]}', r"rows[0] lacks"),
])
def test_gate_check_names_a_corrupt_results_file(tmp_path, text, reason, capsys):
    bad = tmp_path / "results.json"
    bad.write_text(text)
    code, out = call(["gate", "check", "--results", str(bad), "--baseline-dir",
                      str(tmp_path)], capsys)
    assert code == 2 and str(bad) in out and reason in out, out


@pytest.mark.parametrize(("text", "reason"), [
    ("", "not readable as JSON"),
    ('"a string"', "is a JSON str"),
    ('{"kind": "something else"}', "kind 'something else'"),
    ('{"machine": "m", "n_runs": 3, "margin": 1.5, "case_floor": 0.1, "group_floor": 0.05,'
     ' "spread": {}, "entries": "lots", "groups": []}', "entries is str, expected a list"),
    ('{"machine": "m", "n_runs": "ten"}', "n_runs is 'ten', expected a number"),
])
def test_gate_check_names_a_corrupt_baseline(tmp_path, text, reason, capsys):
    results = _results_file(tmp_path)
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    bad = baselines / f"{GATE_KIND}.json"
    bad.write_text(text)
    code, out = call(["gate", "check", "--results", str(results), "--baseline-dir",
                      str(baselines)], capsys)
    assert code == 2 and str(bad) in out and reason in out, out


def test_gate_accept_needs_three_runs(tmp_path, capsys):
    one = _results_file(tmp_path)
    code, out = call(["gate", "accept", "--results", str(one), "--baseline-dir",
                      str(tmp_path)], capsys)
    assert code == 2 and "argument --results: a baseline needs at least 3 runs" in out
    assert not list(tmp_path.glob(f"{GATE_KIND}*"))  # no baseline written


def test_gate_accept_names_a_bad_results_file_and_writes_nothing(tmp_path, capsys):
    files = [_results_file(tmp_path, f"r{i}.json") for i in range(2)]
    bad = tmp_path / "r2.json"
    bad.write_text("null")
    code, out = call(["gate", "accept", "--results", *map(str, files), str(bad),
                      "--baseline-dir", str(tmp_path / "baselines")], capsys)
    assert code == 2 and str(bad) in out and "is a JSON NoneType" in out, out
    assert not (tmp_path / "baselines").exists()


# the dashboard: a record whose fields have the wrong types is skipped, the page is written


def test_dashboard_skips_a_record_with_wrongly_typed_fields(tmp_path, capsys):
    hist, page = tmp_path / "history", tmp_path / "dash" / "index.html"
    history.append(history_results(commit="1" * 40), hist)
    raw = history.make_record(history_results(commit="2" * 40))
    raw["rows"][0].update(median_s="fast", batch=[16], backend=7)
    bad = hist / HISTORY_KIND / "20261124T000000Z-bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.warns(history.HistoryWarning, match=re.escape(str(bad))):
        code, out = call(["dashboard", "--history", str(hist), "--out", str(page)], capsys)
    assert code == 0 and "(1 runs)" in out
    assert "1 recorded runs" in page.read_text()


def test_dashboard_with_nothing_to_show_is_an_error(tmp_path, capsys):
    hist = tmp_path / "history"
    (hist / HISTORY_KIND).mkdir(parents=True)
    (hist / HISTORY_KIND / "bad.json").write_text("[]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", history.HistoryWarning)
        code, out = call(["dashboard", "--history", str(hist), "--out",
                          str(tmp_path / "i.html")], capsys)
    assert code == 2 and "glai-bench dashboard: error: records: the history is empty" in out
    assert not (tmp_path / "i.html").exists()


# render and merge: a folder of garbage is refused naming the file; a good report survives


@pytest.mark.parametrize("command", ["render", "merge"])
def test_a_folder_of_garbage_is_refused_and_the_old_report_kept(command, garbage_run, tmp_path,
                                                                capsys):
    out_dir = garbage_run if command == "render" else tmp_path / "merged"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "summary.md").write_text("the good summary\n")
    argv = [command, str(out_dir)] if command == "render" else [command, str(out_dir),
                                                                 str(garbage_run)]
    code, out = call(argv, capsys)
    where = garbage_run / "results.json"
    assert code == 2 and f"{where}: results file not readable as JSON" in out
    assert (out_dir / "summary.md").read_text() == "the good summary\n"


def test_render_names_a_results_csv_that_is_not_one(tmp_path, capsys):
    run = write_run(tmp_path, "run", [_row("torch", 16, 1.0)], Ceilings({"float32": 1e11}, 1e10))
    (run / "results.csv").write_text("a,b\n1,2\n")
    code, out = call(["render", str(run)], capsys)
    assert code == 2 and f"{run / 'results.csv'}: not a results.csv of this suite" in out


@pytest.mark.parametrize(("change", "reason"), [
    (lambda meta: meta["provenance"].pop("torch_version"),
     "provenance.torch_version is missing, expected a string"),
    (lambda meta: meta.update(preset="quick"), "preset is str, expected an object"),
    (lambda meta: meta["ceilings"].update(bogus=1), "the ceilings are malformed"),
])
def test_render_names_a_results_json_that_lacks_what_the_reports_read(tmp_path, change, reason,
                                                                       capsys):
    run = write_run(tmp_path, "run", [_row("torch", 16, 1.0)], Ceilings({"float32": 1e11}, 1e10))
    meta = json.loads((run / "results.json").read_text())
    change(meta)
    (run / "results.json").write_text(json.dumps(meta))
    code, out = call(["render", str(run)], capsys)
    assert code == 2 and f"{run / 'results.json'}: " in out and reason in out, out


def test_render_of_a_good_run_replaces_its_report(tmp_path, capsys):
    run = write_run(tmp_path, "run", [_row("torch", 16, 1.0), _row("cpp", 16, 0.5)],
                    Ceilings({"float32": 1e11}, 1e10))
    meta = json.loads((run / "results.json").read_text())
    del meta["dispatch"]  # test_merge's runs carry only the dispatch table's machine kind
    (run / "results.json").write_text(json.dumps(meta))
    (run / "summary.md").write_text("an old summary\n")
    code, out = call(["render", str(run)], capsys)
    assert code == 0 and f"wrote {run / 'summary.md'}" in out
    assert "# Kernel benchmarks on" in (run / "summary.md").read_text()
    assert not list(run.glob(".staging-*"))


def test_an_empty_folder_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out = call(["render", str(tmp_path / "empty")], capsys)
    where = tmp_path / "empty" / "results.json"
    assert code == 2 and f"{where}: results file not readable as JSON" in out


def test_merge_of_runs_that_do_not_fit_keeps_the_old_report(tmp_path, capsys):
    ceilings = Ceilings({"float32": 1e11}, 1e10)
    here = write_run(tmp_path, "here", [_row("torch", 16, 1.0)], ceilings)
    there = write_run(tmp_path, "there", [_row("torch", 256, 1.0)], ceilings, machine="other")
    out_dir = tmp_path / "merged"
    out_dir.mkdir()
    (out_dir / "summary.md").write_text("the good summary\n")
    code, out = call(["merge", str(out_dir), str(here), str(there)], capsys)
    assert code == 2 and "glai-bench merge: error: merge: runs must come from one machine" in out
    assert [p.name for p in out_dir.iterdir()] == ["summary.md"]
    assert (out_dir / "summary.md").read_text() == "the good summary\n"


def test_a_render_that_fails_midway_replaces_nothing(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path, "run", [_row("torch", 16, 1.0)], Ceilings({"float32": 1e11}, 1e10))
    (run / "summary.md").write_text("the good summary\n")
    (run / "plots").mkdir()
    (run / "plots" / "roofline.png").write_bytes(b"the good chart")

    def broken(*args, **kwargs):
        raise RuntimeError("the summary could not be composed")

    monkeypatch.setattr(summary, "render", broken)
    code, out = call(["render", str(run)], capsys)
    # the last line of defence: one line naming the command and the error
    assert code == 1
    assert ("glai-bench render: error: RuntimeError: the summary could not be composed\n"
            "(set GLAI_BENCH_TRACEBACK=1 for the traceback)") in out
    assert (run / "summary.md").read_text() == "the good summary\n"
    assert (run / "plots" / "roofline.png").read_bytes() == b"the good chart"
    assert sorted(p.name for p in run.iterdir()) == ["plots", "results.csv", "results.json",
                                                     "summary.md"]  # no staging left behind


def test_the_traceback_is_there_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("GLAI_BENCH_TRACEBACK", "1")
    monkeypatch.setattr(render, "render", lambda out_dir: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bench_main.main(["render", str(tmp_path)])


def test_holdout_names_a_baseline_that_is_not_one(tmp_path, capsys):
    bad = tmp_path / "baseline.json"
    bad.write_text('{"kind": "glai-kernels-gate-baseline"}')
    code, out = call(["holdout", str(bad)], capsys)
    assert code == 2 and str(bad) in out and "not a usable baseline" in out, out


def test_an_unexpected_error_is_one_line_naming_the_command(tmp_path, monkeypatch, capsys):
    """main's last line of defence: an error no check foresaw still ends in one line with the
    command, the error's type and message, and a non-zero status; no traceback."""
    monkeypatch.delenv("GLAI_BENCH_TRACEBACK", raising=False)

    def fails(out_dir):
        raise OSError(f"{out_dir}/plots: disk full")

    monkeypatch.setattr(render, "render", fails)
    code, out = call(["render", str(tmp_path)], capsys)
    assert code == 1 and "Traceback" not in out, out
    assert "glai-bench render: error: OSError:" in out and "disk full" in out, out


# the real entry point, in a fresh process


def _python_m_bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GLAI_BENCH_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_python_m_bench_run_with_zero_threads(capsys):
    done = _python_m_bench("run", "--threads", "0")
    assert done.returncode == 2
    assert ("glai-bench run: error: argument --threads: must be a positive integer, got '0'"
            in done.stderr), done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_python_m_bench_gate_check_with_a_corrupt_results_file(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text("{ not json")
    done = _python_m_bench("gate", "check", "--results", str(bad), "--baseline-dir",
                           str(tmp_path))
    assert done.returncode == 2
    assert f"glai-bench gate check: error: {bad}: results file not readable" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
