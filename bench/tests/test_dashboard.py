"""The dashboard: rendered from a history, it holds the plots, the latest table and the filters;
in a real headless Chromium it renders, its plots are not blank and its script raises nothing."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from bench.reporting import dashboard, history
from bench.tests.test_history import KIND, MALFORMED, results, write_malformed

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


def _images(text: str) -> list[np.ndarray]:
    srcs = re.findall(r'<img class="plot"[^>]* src="data:image/png;base64,([^"]+)"', text)
    return [matplotlib.image.imread(io.BytesIO(base64.b64decode(s)), format="png")
            for s in srcs]


def test_page_has_a_plot_per_machine_dtype_and_pass(page):
    text = page.read_text()
    images = _images(text)
    # cpu: float32 and bfloat16 forward; cuda: float32 forward
    assert len(images) == 3
    for img in images:
        assert img.shape[0] > 200 and img.shape[1] > 200
        assert np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 10  # not blank
    assert 'data-machine="cuda-NVIDIA-H100"' in text
    for select in ("filter-machine", "filter-dtype", "filter-pass"):
        assert f'id="{select}"' in text
    assert '<option value="bfloat16">' in text


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
    assert "2 recorded runs" in text and len(_images(text)) == 1
    assert "(2 runs)" in capsys.readouterr().out


def test_the_dashboard_names_a_foreign_file(tmp_path, capsys):
    hist = tmp_path / "history"
    history.append(results(), hist)
    (hist / KIND / "notes.json").write_text('{"kind": "something else"}')
    assert dashboard.main(["--history", str(hist), "--out", str(tmp_path / "i.html")]) == 2
    assert "notes.json is not a glai-kernels history record" in capsys.readouterr().err


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
    proc = _chromium("--dump-dom", page.as_uri())
    body = _body(proc.stdout)
    assert body.get("status") == "ready", proc.stderr[-2000:]
    assert body["errors"] == ""
    assert body["plots"] == "3" and body["blank"] == "0"


@needs_chromium
def test_chromium_applies_the_filters_from_the_url(page):
    proc = _chromium("--dump-dom", page.as_uri() + f"#machine={KIND}&dtype=bfloat16")
    dom = proc.stdout
    assert _body(dom).get("status") == "ready", proc.stderr[-2000:]
    figures = re.findall(r"<figure ([^>]*)>", dom)
    shown = [f for f in figures if "hidden" not in f]
    assert len(figures) == 3 and len(shown) == 1
    assert 'data-dtype="bfloat16"' in shown[0] and f'data-machine="{KIND}"' in shown[0]
    assert "1 plots shown" in dom


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
