"""The dashboard: rendered from a history, it holds the summary of what changed, the plots' data,
the latest table and the filters; in a real headless Chromium it draws the plots, the filters
change what is shown, the summary is on the first screen and its script raises nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from bench.reporting import dashboard, dashboard_data, history
from bench.tests.helpers import HISTORY_KIND as KIND
from bench.tests.helpers import MALFORMED, write_malformed
from bench.tests.helpers import history_results as results

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium not found: install Debian's `chromium` package "
                             "(`.ci/run` does) to load the dashboard in a real browser")


@pytest.fixture
def page(tmp_path) -> Path:
    """A dashboard over three runs on one CPU machine and one on a GPU, float32 and bfloat16."""
    for i, speedup in enumerate((2.0, 2.5, 1.5)):
        run = results(commit=f"{i}" * 40, date=f"2026-11-2{i}T00:00:00+00:00", speedup=speedup)
        extra = [{**row, "dtype": "bfloat16", "batch": 32} for row in run["rows"]]
        run["rows"] += extra
        history.append(run, tmp_path / "history")
    history.append(results(machine="cuda-NVIDIA-H100", speedup=9.0), tmp_path / "history")
    return dashboard.render(history.load(tmp_path / "history"), tmp_path / "out" / "index.html")


def _data(text: str) -> dict:
    """The page's data: runs per machine and every series the plots can draw."""
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert found, "the page has no data block"
    return json.loads(found.group(1))


def _series(data: dict, **key: object) -> list[dict]:
    return [s for s in data["series"] if all(s[k] == v for k, v in key.items())]


def test_page_has_a_series_per_backend_and_the_filters(page):
    text = page.read_text()
    data = _data(text)
    # runs oldest first, short commits; the GPU machine's one run on its own
    assert [r["commit"] for r in data["runs"][KIND]] == ["0000000", "1111111", "2222222"]
    assert len(data["runs"]["cuda-NVIDIA-H100"]) == 1
    torch = _series(data, m=KIND, d="float32", p="forward", h="A2", b=16, k="torch")
    assert len(torch) == 1 and torch[0]["s"] == [2.0, 2.5, 1.5]
    assert torch[0]["t"] == [1.0, 0.8, 1.333]  # ms, 4 significant digits
    assert len(_series(data, m=KIND, d="bfloat16", b=32)) == 2  # einsum and torch
    assert data["defaults"] == {"machine": "cuda-NVIDIA-H100", "batch": "16",
                                "dtype": "float32", "metric": "speedup"}
    assert 'data-machine="cuda-NVIDIA-H100"' in text
    for select in ("filter-machine", "filter-dtype", "filter-pass", "filter-batch",
                   "filter-metric"):
        assert f'id="{select}"' in text
    assert '<option value="bfloat16">' in text and '<option value="16" selected>' in text
    assert "<img" not in text and "https://" not in text  # nothing fetched


def _summary(text: str) -> str:
    return text.split('<table id="summary">')[1].split("</table>")[0]


def test_summary_marks_changes_beyond_the_noise_band(page):
    """The last cpu run's speedup 1.5 against 2.5 before it (the best of the runs before it
    too) is -40%: marked worse on both counts; the GPU's only run has nothing to compare."""
    text = page.read_text()
    rows = re.findall(r'<tr data-machine="([^"]+)" data-dtype="([^"]+)" data-pass_="([^"]+)">'
                      r"(.*?)</tr>", _summary(text))
    assert [(m, d, p) for m, d, p, _ in rows] == [(KIND, "float32", "forward"),
                                                  ("cuda-NVIDIA-H100", "float32", "forward")]
    cpu, gpu = rows[0][3], rows[1][3]
    assert "1.50×" in cpu and cpu.count('<span class="worse">-40%</span>') == 2
    assert "9.00×" in gpu and "<span" not in gpu and "<small>— · —</small>" in gpu
    # bfloat16 ran at B = 32 only: not the paper's batch, not in the summary
    assert "bfloat16" not in _summary(text)
    assert "regression gate" in text  # the page says where its noise band comes from


def test_summary_leaves_changes_within_the_band_unmarked(tmp_path):
    for i, speedup in enumerate((2.0, 2.1)):  # +5%, inside the gate's 10% floor
        history.append(results(commit=f"{i}" * 40, date=f"2026-11-2{i}T00:00:00+00:00",
                               speedup=speedup), tmp_path)
    records = history.load(tmp_path)
    runs = dashboard_data.run_table(records)
    df = history.frame(records).assign(run=[0, 0, 1, 1])
    (row,) = dashboard_data.summary(df, runs, {KIND: 0.10})
    cell = row["cells"]["torch"]
    assert (cell["latest"], cell["prev"], cell["best"]) == (2.1, 2.0, 2.0)
    assert cell["vs_prev"] == {"pct": pytest.approx(5.0), "mark": ""}
    assert "einsum" not in row["cells"]  # the baseline: 1 by definition
    (row,) = dashboard_data.summary(df, runs, {KIND: 0.04})
    assert row["cells"]["torch"]["vs_prev"]["mark"] == "better"


def test_runs_before_the_physical_ceilings_are_the_old_roofline_model(tmp_path):
    old = results(commit="1" * 40, date="2026-11-20T00:00:00+00:00")
    new = {**results(commit="2" * 40), "ceilings": {"peak_flops": {"float32": 1e11}}}
    for run in (old, new):
        history.append(run, tmp_path)
    runs = dashboard_data.run_table(history.load(tmp_path))
    assert [r["old_model"] for r in runs[KIND]] == [True, False]


def test_latest_table_shows_each_machines_last_run(page):
    text = page.read_text()
    latest = text.split('<table id="latest">')[1].split("</table>")[0]
    rows = re.findall(r"<tr data-machine=\"([^\"]+)\"", latest)
    assert rows.count(KIND) == 4 and rows.count("cuda-NVIDIA-H100") == 2
    # the last cpu run had speedup 1.5; the winner is marked
    assert "<td>1.50</td>" in latest and 'class="winner"' in latest
    runs = text.split('<table id="runs">')[1]
    assert runs.count("<tr data-machine") == 4


def test_an_empty_history_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="history is empty"):
        dashboard.render([], tmp_path / "index.html")
    assert dashboard.main(["--history", str(tmp_path), "--out", str(tmp_path / "i.html")]) == 2


def test_the_dashboard_renders_past_malformed_records(tmp_path, capsys):
    """Every kind of bad file in bench/tests/test_history.py's MALFORMED at once: each is skipped
    with a warning naming it and the page shows the good runs."""
    hist, out = tmp_path / "history", tmp_path / "index.html"
    for i in range(2):
        history.append(results(commit=f"{i}" * 40, date=f"2026-11-2{i}T00:00:00+00:00"), hist)
    bad = {str(write_malformed(hist, case)) for case in MALFORMED}
    with pytest.warns(history.HistoryWarning) as caught:
        assert dashboard.main(["--history", str(hist), "--out", str(out)]) == 0
    named = {path for path in bad for w in caught if f"{path} skipped" in str(w.message)}
    assert named == bad and len(caught) == len(bad)
    text = out.read_text()
    assert "2 recorded runs" in text and len(_data(text)["runs"][KIND]) == 2
    assert "(2 runs)" in capsys.readouterr().out


def test_the_dashboard_names_a_foreign_file(tmp_path, capsys):
    hist = tmp_path / "history"
    history.append(results(), hist)
    (hist / KIND / "notes.json").write_text('{"kind": "something else"}')
    assert dashboard.main(["--history", str(hist), "--out", str(tmp_path / "i.html")]) == 2
    assert "notes.json is not a glai-kernels history record" in capsys.readouterr().err


def test_kept_fraction_rows_at_the_matched_mu_are_a_series_of_their_own(tmp_path):
    """The kept-fraction sweep's forward at the head's matched K is the "kept forward" pass;
    its other kept fractions are not plotted."""
    from bench.harness.sweeps import matched_keep
    from glai_kernels.paper_heads import PAPER_HEADS

    run = results()
    case = {**run["rows"][1], "sweep": "kept", "backend": "cpp", "speedup_vs_baseline": None}
    keep = matched_keep(PAPER_HEADS["A2"])
    run["rows"] += [{**case, "mu": 0.01, "nnz": keep, "median_s": 1e-3},
                    {**case, "mu": 0.5, "nnz": 50 * keep, "median_s": 9e-3}]
    history.append(run, tmp_path)
    records = history.load(tmp_path)
    df = history.frame(records).assign(run=0)
    kept = [s for s in dashboard_data.series(df, dashboard_data.run_table(records))
            if s["p"] == dashboard_data.KEPT_PASS]
    assert [(s["h"], s["k"], s["t"], s["s"]) for s in kept] == [("A2", "cpp", [1.0], [None])]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
             *args], capture_output=True, text=True, timeout=120)


def _body(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom)
    assert tag, dom[:2000]
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', tag.group(1)))


@needs_chromium
def test_chromium_renders_the_plots_without_script_errors(page):
    """By default: the latest run's machine (the GPU), float32, the paper's batch, speedups:
    one plot (A2 forward), torch's line (the baseline's speedup is 1 by definition)."""
    proc = _chromium("--dump-dom", page.as_uri())
    body = _body(proc.stdout)
    assert body.get("status") == "ready", proc.stderr[-2000:]
    assert body["errors"] == ""
    assert body["plots"] == "1" and body["blank"] == "0"
    (svg,) = re.findall(r'<svg class="plot".*?</svg>', proc.stdout, re.S)
    assert 'data-head="A2"' in svg and svg.count("<circle") == 1 and "torch: 9.00" in svg
    assert "1 plots shown" in proc.stdout


def _shown(dom: str, pattern: str) -> list[str]:
    return [m for m in re.findall(pattern, dom) if " hidden" not in m]


@needs_chromium
def test_chromium_applies_the_filters_from_the_url(page):
    proc = _chromium("--dump-dom", page.as_uri() + f"#machine={KIND}&dtype=bfloat16&batch=32")
    dom = proc.stdout
    body = _body(dom)
    assert body.get("status") == "ready" and body["errors"] == "", proc.stderr[-2000:]
    (row,) = re.findall(r'<div class="plotrow"([^>]*)>', dom)
    assert 'data-dtype="bfloat16"' in row and 'data-batch="32"' in row
    assert f'data-machine="{KIND}"' in row and body["plots"] == "1"
    # three runs: three points on torch's line
    (svg,) = re.findall(r'<svg class="plot".*?</svg>', dom, re.S)
    assert svg.count("<circle") == 3 and svg.count("<path") == 1
    # the tables' rows of the other machine and dtype are hidden
    latest = dom.split('<table id="latest">')[1].split("</table>")[0]
    shown = _shown(latest, r"<tr ([^>]*)>")
    assert len(shown) == 2 and all('data-dtype="bfloat16"' in r for r in shown)


@needs_chromium
def test_chromium_marks_shares_of_the_old_roofline_model(page):
    """The fixture's runs record no native peak: every % of roofline is the old model's,
    drawn hollow and grey and left out of the lines."""
    dom = _chromium("--dump-dom", page.as_uri() + f"#machine={KIND}&metric=roof").stdout
    body = _body(dom)
    assert body.get("status") == "ready" and body["errors"] == ""
    plots = re.findall(r'<svg class="plot".*?</svg>', dom, re.S)
    assert len(plots) == 1 and plots[0].count('fill="none"') == 6  # einsum and torch, 3 runs
    assert "<path" not in plots[0] and "old roofline model" in plots[0]


@needs_chromium
def test_chromium_shows_the_summary_on_the_first_screen(page):
    """At 1400 × 900 the summary table starts inside the first screen (its layout position,
    which the page's script measures with getBoundingClientRect and writes on the body)."""
    body = _body(_chromium("--dump-dom", "--window-size=1400,900", page.as_uri()).stdout)
    assert body.get("status") == "ready"
    assert 0 < int(body["summarytop"]) < 900 - 60  # its head and first rows visible


@needs_chromium
def test_chromium_screenshot_is_not_blank(page, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _chromium(f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    assert shot.exists(), proc.stderr[-2000:]
    img = matplotlib.image.imread(shot)
    assert np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 50


def test_the_committed_dashboard_is_current():
    """reports/dashboard/index.html shows every committed history record."""
    page = dashboard.OUT
    assert page.exists(), "run `nox -s dashboard` and commit reports/dashboard/index.html"
    text = page.read_text()
    records = history.load()
    assert f"{len(records)} recorded runs" in text
    for record in records:
        assert record.commit[:12] in text
