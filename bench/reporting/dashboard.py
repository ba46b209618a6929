"""The regression dashboard: one static HTML page from the benchmark history, no server.

    glai-bench dashboard [--history reports/history] [--out reports/dashboard/index.html]
    (also `nox -s dashboard`)

The page holds everything inline (the data as JSON, CSS, its script: no network), so it opens
from a file. Top: what changed, the latest run against the previous one and against the best of
the ten before it, per head and pass at the paper's batch, each backend's speedup over the
baseline, changes beyond the noise band marked (`bench.reporting.dashboard_data`). Below: one
small plot per (head, pass), a line per backend, for the chosen machine kind
(`bench.reporting.history.machine_kind`), dtype, batch and metric (speedup, % of roofline, ms;
`bench.reporting.dashboard_page` draws them); the latest run's full table; the list of runs.
Filters (machine, dtype, pass, batch, metric) choose what is shown; the URL fragment sets them
(`index.html#machine=cpu-2core-GenuineIntel-family-6-model-207&batch=256&metric=roof`).
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import math
import sys
from pathlib import Path

import pandas as pd

from bench.cli_types import existing_dir, output_file
from bench.harness.passes import DTYPES
from bench.reporting import dashboard_data, history
from bench.reporting.dashboard_page import SCRIPT, TEMPLATE
from glai_kernels.paper_heads import PAPER_HEADS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "reports" / "dashboard" / "index.html"
# the plots' metrics: filter value -> what it shows
METRICS = {"speedup": "speedup over the baseline (×)", "roof": "% of roofline",
           "ms": "median ms per call"}


def _attrs(**values: object) -> str:
    return " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in values.items())


def _fmt(value: object, spec: str) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return format(value, spec)


def latest_table(df: pd.DataFrame) -> str:
    """HTML rows of the latest run of each machine (every measurement)."""
    out = []
    for machine, sub in df.groupby("machine"):
        last = sub[sub["run"] == sub["run"].max()].drop_duplicates(list(history.ROW_KEY))
        for _, r in last.sort_values(["dtype", "pass", "head", "batch", "backend"]).iterrows():
            cls = ' class="winner"' if r["winner"] is True else ""
            time_ms = r["median_s"] * 1e3 if pd.notna(r["median_s"]) else None
            mu_pct = 100 * r["mu"] if pd.notna(r["mu"]) else None
            out.append(
                f"<tr {_attrs(machine=machine, dtype=r['dtype'], pass_=r['pass'])}{cls}>"
                f"<td>{html.escape(machine)}</td><td>{r['backend']}</td><td>{r['head']}</td>"
                f"<td>{r['batch']}</td><td>{r['inputs']}</td><td>{r['paths']}</td>"
                f"<td>{r['outputs']}</td><td>{_fmt(mu_pct, '.3g')}</td>"
                f"<td>{r['dtype']}</td><td>{r['pass']}</td>"
                f"<td>{_fmt(time_ms, '.3g')}</td><td>{_fmt(r['speedup_vs_baseline'], '.2f')}</td>"
                f"<td>{_fmt(r['roofline_pct'], '.1f')}</td><td>{_fmt(r['gflops'], '.1f')}</td>"
                f"<td>{html.escape(str(r['status']))}</td></tr>")
    return "\n".join(out)


def _runs_table(records: list[history.Record]) -> str:
    rows = []
    for r in records:
        load = html.escape(str(r.provenance.get("load_average", "")))
        rows.append(f"<tr {_attrs(machine=r.machine)}><td>{html.escape(r.date)}</td>"
                    f"<td><code>{html.escape(r.commit[:12])}</code></td>"
                    f"<td>{html.escape(r.machine)}</td><td>{html.escape(r.device_name)}</td>"
                    f"<td>{html.escape(r.preset)}</td><td>{len(r.rows)}</td><td>{load}</td>"
                    f"<td><code>{html.escape(r.command)}</code></td></tr>")
    return "\n".join(rows)


def _options(name: str, values: list[str], selected: str, everything: bool = True) -> str:
    """A filter's <select>: `selected` chosen first; `everything` adds an "all" choice."""
    opts = "".join(f'<option value="{html.escape(v)}"{" selected" if v == selected else ""}>'
                   f"{html.escape(METRICS.get(v, v) if name == 'metric' else v)}</option>"
                   for v in values)
    every = f'<option value=""{" selected" if not selected else ""}>all</option>'
    return (f'<label>{name} <select id="filter-{name}" data-filter="{name}">'
            f'{every if everything else ""}{opts}</select></label>')


PASS_ORDER = ("both", "train", "forward", "backward")


def _order(dtype: str, pass_: str) -> tuple[int, int]:
    """float32 (the contract's first dtype) and forward+backward first: what a reader looks
    for first."""
    rank = {name: i for i, name in enumerate(DTYPES)}
    return rank.get(dtype, len(rank)), {p: i for i, p in enumerate(PASS_ORDER)}.get(pass_, 9)


def _summary_rows(rows: list[dict], backends: list[str]) -> str:
    """HTML rows of `dashboard_data.summary`: a cell per backend, marked worse / better."""
    out = []
    for r in rows:
        cells = []
        for backend in backends:
            c = r["cells"].get(backend)
            if c is None:
                cells.append("<td></td>")
                continue
            # each change coloured on its own: a fall from the best of ten with no change
            # since the previous run is an old regression, not this run's
            changes = " · ".join(
                "—" if ch is None else
                f'<span class="{ch["mark"]}">{round(ch["pct"]):+d}%</span>' if ch["mark"] else
                f"{round(ch['pct']):+d}%" for ch in (c["vs_prev"], c["vs_best"]))
            title = (f"latest {c['latest']:.3g}, previous {_fmt(c['prev'], '.3g') or '—'}, "
                     f"best of the last {dashboard_data.BEST_OF} {_fmt(c['best'], '.3g') or '—'}")
            cells.append(f'<td title="{html.escape(title)}">{c["latest"]:.2f}× '
                         f"<small>{changes}</small></td>")
        out.append(f"<tr {_attrs(machine=r['machine'], dtype=r['dtype'], pass_=r['pass'])}>"
                   f"<td>{html.escape(r['machine'])}</td><td>{r['dtype']}</td>"
                   f"<td>{r['pass']}</td><td>{r['head']}</td>{''.join(cells)}</tr>")
    return "\n".join(out)


def render(records: list[history.Record], out: Path = OUT) -> Path:
    """Write the dashboard for `records` (oldest first) to `out`; returns `out`."""
    df = history.frame(records)
    if df.empty:
        raise ValueError("records: the history is empty; run `python -m bench` first")
    runs = dashboard_data.run_table(records)
    # each measurement's run: its record's index among its machine's runs, oldest first
    index = {run["record"]: i for machine_runs in runs.values()
             for i, run in enumerate(machine_runs)}
    df = df.assign(run=[index[str(r.path or i)] for i, r in enumerate(records) for _ in r.rows])
    bands = {m: dashboard_data.noise_band(m) for m in runs}
    rows = sorted(dashboard_data.summary(df, runs, {m: b[0] for m, b in bands.items()}),
                  key=lambda r: (r["machine"], *_order(r["dtype"], r["pass"])))
    baselines = sorted({r.baseline for r in records} - {""})
    backends = sorted({b for r in rows for b in r["cells"]})
    latest = records[-1]
    band = " / ".join(sorted({f"{100 * math.expm1(b):.1f}%" for b, _ in bands.values()}))
    values = {k: sorted(set(map(str, df[k]))) for k in ("machine", "dtype", "pass")}
    values["pass"] += [dashboard_data.KEPT_PASS] if df["mu"].notna().any() else []
    defaults = {"machine": latest.machine, "batch": str(dashboard_data.PAPER_BATCH),
                "dtype": next((d for d in DTYPES if d in values["dtype"]), ""),
                "metric": "speedup"}
    data = {"runs": runs, "series": dashboard_data.series(df, runs), "defaults": defaults,
            "baselines": baselines, "heads": list(PAPER_HEADS), "dtypes": list(DTYPES),
            "passes": [*PASS_ORDER, dashboard_data.KEPT_PASS]}
    batches = sorted({int(b) for b in df["batch"].dropna()})
    filters = [_options("machine", values["machine"], defaults["machine"], everything=False),
               _options("dtype", values["dtype"], defaults["dtype"]),
               _options("pass", values["pass"], ""),
               _options("batch", list(map(str, batches)), defaults["batch"], everything=False),
               _options("metric", list(METRICS), "speedup", everything=False)]
    page = TEMPLATE.format(
        generated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        n_records=len(records), machines=html.escape(", ".join(values["machine"])),
        latest_run=html.escape(f"{latest.commit[:7]} on {latest.machine}, {latest.date[:16]}"),
        baselines=html.escape(", ".join(baselines) or "?"),
        filters="\n".join(filters), batch=dashboard_data.PAPER_BATCH,
        best_of=dashboard_data.BEST_OF, band=html.escape(band),
        band_source="the regression gate's per-case floor ("
                    + " or ".join(sorted({source for _, source in bands.values()})) + ")",
        summary_head="".join(f"<th>{html.escape(b)}<br><small>now · vs prev · vs best"
                             f"</small></th>" for b in backends),
        summary=_summary_rows(rows, backends), latest=latest_table(df),
        runs=_runs_table(records),
        # "</" must not end the data's <script> early: JSON reads "<\/" as "</"
        data=json.dumps(data, separators=(",", ":")).replace("</", "<\\/"), script=SCRIPT)
    out.parent.mkdir(parents=True, exist_ok=True)
    history.write_atomic(out, page)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="glai-bench dashboard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=existing_dir, default=history.HISTORY_DIR,
                   help="the history folder to read (default: reports/history)")
    p.add_argument("--out", type=output_file, default=OUT,
                   help="the page to write (default: reports/dashboard/index.html)")
    args = p.parse_args(argv)
    try:
        records = history.load(args.history)  # a bad record file is skipped with a warning
        path = render(records, args.out)
    except (OSError, ValueError) as e:  # a foreign file in the history, an empty history
        print(f"glai-bench dashboard: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({len(records)} runs); open it in a browser, no server needed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
