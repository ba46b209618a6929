"""The regression dashboard: one static HTML page from the benchmark history, no server.

    glai-bench dashboard [--history reports/history] [--out reports/dashboard/index.html]
    (also `nox -s dashboard`)

The page holds everything inline (PNG plots as data URLs, CSS, a little JavaScript), so it opens
from a file. Per machine kind (`bench.reporting.history.machine_kind`: on a CPU, with its
model), dtype and pass: each backend's speedup over the baseline backend and
% of roofline across the recorded runs, one panel per paper head (a line per backend and batch);
the latest run's full table; the list of runs. Filters (machine, dtype, pass) hide what does not
match; the URL fragment sets them
(`index.html#machine=cpu-2core-GenuineIntel-family-6-model-207&dtype=float32`).

When its script has run, the page marks itself for the browser test: `<body data-status="ready"
data-plots=N data-blank=K data-errors=...>`, where K counts plots whose pixels are all one colour.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from bench.cli_types import existing_dir, output_file
from bench.harness.passes import DTYPES
from bench.harness.sweeps import PAPER_BATCHES
from bench.reporting import history
from glai_kernels.paper_heads import PAPER_HEADS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "reports" / "dashboard" / "index.html"
METRICS = {"speedup_vs_baseline": "speedup over the baseline (×)",
           "roofline_pct": "% of roofline"}
LINESTYLES = ("-", "--", ":", "-.")


def _run_label(record_row: pd.Series) -> str:
    return f"{str(record_row['commit'])[:7]}\n{str(record_row['date'])[5:16]}"


def _is_paper_shape(row) -> bool:
    """The head's own I, P, O at the paper's batches (the sweeps around it vary one axis),
    of the dense op (not a kept-fraction row, which has a `mu`)."""
    head = PAPER_HEADS.get(row.head)
    if head is None or pd.notna(row.mu):
        return False
    shape = head.shape(1)
    return (row.batch in PAPER_BATCHES and
            (row.inputs, row.paths, row.outputs) == (shape.inputs, shape.paths, shape.outputs))


def trend_figure(df: pd.DataFrame, runs: pd.DataFrame) -> str:
    """PNG data URL: rows = metrics, columns = heads; x = runs in order, a line per backend/batch.

    `df`: the history frame of one machine, dtype and pass; `runs`: that machine's runs in order
    (columns run, commit, date).
    """
    df = df[[_is_paper_shape(r) for r in df[["head", "batch", "inputs", "paths", "outputs",
                                             "mu"]].itertuples(index=False)]]
    heads = [h for h in PAPER_HEADS if h in set(df["head"])]
    # the backend each record's speedups are over: first, and without a speedup line
    baselines = set(df["baseline"])
    backends = sorted(set(df["backend"]), key=lambda b: (b not in baselines, b))
    colors = {b: plt.get_cmap("tab10")(i % 10) for i, b in enumerate(backends)}
    fig, axes = plt.subplots(len(METRICS), len(heads), squeeze=False, sharex=True,
                             figsize=(2.6 * len(heads) + 1.2, 5.0))
    x_labels = [_run_label(r) for _, r in runs.iterrows()]
    for col, head in enumerate(heads):
        sub = df[df["head"] == head]
        batches = sorted(set(sub["batch"]))
        for row, (metric, label) in enumerate(METRICS.items()):
            ax = axes[row][col]
            for backend in backends:
                for k, batch in enumerate(batches):
                    line = sub[(sub["backend"] == backend) & (sub["batch"] == batch)]
                    line = line.dropna(subset=[metric]).sort_values("run")
                    if line.empty or (metric == "speedup_vs_baseline" and backend in baselines):
                        continue
                    ax.plot(line["run"], line[metric], marker="o", markersize=3,
                            linestyle=LINESTYLES[k % len(LINESTYLES)], color=colors[backend],
                            label=f"{backend} B={batch}")
            if metric == "speedup_vs_baseline":
                ax.axhline(1.0, color="0.6", linewidth=0.8)
            ax.set_title(f"{head} ({PAPER_HEADS[head].dataset})" if row == 0 else "",
                         fontsize=8)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.set_xticks(range(len(x_labels)), x_labels if row == len(METRICS) - 1 else [],
                          fontsize=6, rotation=90)
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="center right", fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 1.1 / fig.get_figwidth(), 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def kept_trend_figure(df: pd.DataFrame, runs: pd.DataFrame) -> str | None:
    """PNG data URL: the kept-fraction sweep's forward at each head's matched μ across runs,
    ms per call, a line per backend and batch (one panel per head); None without such rows.

    `df`: the history frame of one machine and dtype, kept-fraction rows (with a `mu`)."""
    from bench.harness.sweeps import matched_keep

    df = df[(df["pass"] == "forward") & df["nnz"].notna()]
    # a mask with the frame's index: a bare empty list would select no columns instead of
    # no rows (and the next line would find no "head")
    df = df[pd.Series([n == matched_keep(PAPER_HEADS[h]) if h in PAPER_HEADS else False
                       for h, n in zip(df["head"], df["nnz"], strict=True)],
                      index=df.index, dtype=bool)]
    heads = [h for h in PAPER_HEADS if h in set(df["head"])]
    if not heads:
        return None
    backends = sorted(set(df["backend"]))
    colors = {b: plt.get_cmap("tab10")(i % 10) for i, b in enumerate(backends)}
    fig, axes = plt.subplots(1, len(heads), squeeze=False, figsize=(2.6 * len(heads) + 1.2, 3))
    x_labels = [_run_label(r) for _, r in runs.iterrows()]
    for ax, head in zip(axes[0], heads, strict=True):
        sub = df[df["head"] == head]
        for backend in backends:
            for k, batch in enumerate(sorted(set(sub["batch"]))):
                line = sub[(sub["backend"] == backend) & (sub["batch"] == batch)]
                line = line.dropna(subset=["median_s"]).sort_values("run")
                if not line.empty:
                    ax.plot(line["run"], 1e3 * line["median_s"], marker="o", markersize=3,
                            linestyle=LINESTYLES[k % len(LINESTYLES)], color=colors[backend],
                            label=f"{backend} B={batch}")
        ax.set_yscale("log")
        ax.set_title(f"{head}, μ = {100 * sub['mu'].iloc[0]:.3g}%", fontsize=8)
        ax.set_ylabel("forward, ms per call", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xticks(range(len(x_labels)), x_labels, fontsize=6, rotation=90)
        ax.legend(fontsize=6)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


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


def _options(name: str, values: list[str]) -> str:
    opts = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
    return (f'<label>{name} <select id="filter-{name}" data-filter="{name}">'
            f'<option value="">all</option>{opts}</select></label>')


PASS_ORDER = ("both", "train", "forward", "backward")


def _order(dtype: str, pass_: str) -> tuple[int, int]:
    """float32 (the contract's first dtype) and forward+backward first: what a reader looks
    for first."""
    rank = {name: i for i, name in enumerate(DTYPES)}
    return rank.get(dtype, len(rank)), {p: i for i, p in enumerate(PASS_ORDER)}.get(pass_, 9)


def render(records: list[history.Record], out: Path = OUT) -> Path:
    """Write the dashboard for `records` (oldest first) to `out`; returns `out`."""
    df = history.frame(records)
    if df.empty:
        raise ValueError("records: the history is empty; run `python -m bench` first")
    df = df.copy()
    df["pass_"] = df["pass"]
    order = {str(r.path or i): i for i, r in enumerate(records)}
    df["record"] = [str(r.path or i) for i, r in enumerate(records) for _ in r.rows]
    df["run"] = 0
    figures = []
    for machine, mdf in df.groupby("machine"):
        runs = (mdf.drop_duplicates("record")[["record", "commit", "date"]]
                .assign(order=lambda t: t["record"].map(order)).sort_values("order"))
        runs["run"] = range(len(runs))
        df.loc[mdf.index, "run"] = mdf["record"].map(dict(zip(runs["record"], runs["run"],
                                                            strict=True)))
        mdf = df.loc[mdf.index]
        ok = mdf[(mdf["status"] == "ok") & mdf["mu"].isna()]
        for (dtype, pass_), sub in sorted(
                ok.groupby(["dtype", "pass"]),
                key=lambda item: (*_order(*item[0]), *item[0])):
            title = f"{machine} · {dtype} · {pass_}"
            figures.append(
                f'<figure {_attrs(machine=machine, dtype=dtype, pass_=pass_)}>'
                f"<figcaption><h3>{html.escape(title)}</h3> {len(runs)} runs, oldest left"
                f'</figcaption><img class="plot" alt="{html.escape(title)}" '
                f'src="{trend_figure(sub, runs)}"></figure>')
        kept = mdf[(mdf["status"] == "ok") & mdf["mu"].notna()]
        for dtype, sub in kept.groupby("dtype"):
            image = kept_trend_figure(sub, runs)
            if image is None:
                continue
            title = f"{machine} · {dtype} · sparse estimator forward at the matched μ"
            figures.append(
                f'<figure {_attrs(machine=machine, dtype=dtype, pass_="forward")}>'
                f"<figcaption><h3>{html.escape(title)}</h3> kept-fraction sweep, "
                f"{len(runs)} runs, oldest left</figcaption><img class=\"plot\" "
                f'alt="{html.escape(title)}" src="{image}"></figure>')
    values = {k: sorted(set(map(str, df[k]))) for k in ("machine", "dtype", "pass")}
    page = TEMPLATE.format(
        generated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        n_records=len(records), machines=html.escape(", ".join(values["machine"])),
        baselines=html.escape(", ".join(sorted({r.baseline for r in records} - {""})) or "?"),
        filters="\n".join(_options(k, v) for k, v in values.items()),
        figures="\n".join(figures), latest=latest_table(df), runs=_runs_table(records),
        script=SCRIPT)
    out.parent.mkdir(parents=True, exist_ok=True)
    history.write_atomic(out, page)
    return out


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>glai-kernels benchmark dashboard</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
figure {{ margin: 1em 0; }} img.plot {{ max-width: 100%; border: 1px solid #ddd; }}
figcaption h3 {{ display: inline; margin-right: .5em; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; }}
tr.winner td {{ background: #e8f5e9; font-weight: 600; }}
#filters {{ position: sticky; top: 0; background: #fff; padding: .5em 0; }}
label {{ margin-right: 1.5em; }} [hidden] {{ display: none !important; }}
</style></head>
<body data-status="loading">
<h1>glai-kernels benchmark dashboard</h1>
<p>{n_records} recorded runs on {machines}; generated {generated} by
<code>nox -s dashboard</code> from <code>reports/history/</code>. Speedups are over the baseline
backend ({baselines}) timed in the same run; % of roofline is against the same run's measured
physical ceilings (native FMA peak, triad and copy bandwidth; runs recorded before issue 15 used
the library GEMM's rate). Absolute times on shared machines are noise: read the ratios.</p>
<div id="filters">{filters} <span id="shown"></span></div>
<h2>Across runs</h2>
{figures}
<h2>Latest run, every measurement</h2>
<p>Bold green: the fastest backend that matched the float64 oracle for that shape.</p>
<table id="latest"><thead><tr><th>machine</th><th>backend</th><th>head</th><th>B</th><th>I</th>
<th>P</th><th>O</th><th>μ %</th><th>dtype</th><th>pass</th><th>median ms</th><th>speedup</th>
<th>% roofline</th><th>GFLOP/s</th><th>status</th></tr></thead>
<tbody>
{latest}
</tbody></table>
<h2>Runs</h2>
<table id="runs"><thead><tr><th>date</th><th>commit</th><th>machine</th><th>device</th>
<th>preset</th><th>measurements</th><th>load avg</th><th>command</th></tr></thead>
<tbody>
{runs}
</tbody></table>
<script>
{script}
</script>
</body></html>
"""

SCRIPT = """
"use strict";
const errors = [];
window.addEventListener("error", (e) => { errors.push(String(e.message)); report(); });
const filters = Array.from(document.querySelectorAll("select[data-filter]"));

function applyFilters() {
  const want = {};
  for (const f of filters) want[f.dataset.filter] = f.value;
  let shown = 0;
  for (const el of document.querySelectorAll("figure[data-machine], tr[data-machine]")) {
    const keep = Object.entries(want).every(([k, v]) => {
      const have = el.dataset[k === "pass" ? "pass_" : k];
      return !v || have === undefined || have === v;
    });
    el.hidden = !keep;
    if (keep && el.tagName === "FIGURE") shown += 1;
  }
  document.getElementById("shown").textContent = shown + " plots shown";
  const hash = Object.entries(want).filter(([, v]) => v)
    .map(([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  history.replaceState(null, "", hash ? "#" + hash : location.pathname);
}

function fromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const f of filters) {
    const v = params.get(f.dataset.filter);
    if (v !== null && Array.from(f.options).some((o) => o.value === v)) f.value = v;
  }
}

function isBlank(img) {
  const canvas = document.createElement("canvas");
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  for (let i = 4; i < data.length; i += 4) {
    if (data[i] !== data[0] || data[i + 1] !== data[1] || data[i + 2] !== data[2]) return false;
  }
  return true;
}

function report() {
  document.body.dataset.errors = errors.join(" | ");
}

function check() {
  // runs on "load": every image has loaded (or failed) by then, so this is synchronous and
  // done before a headless browser dumps the page
  const imgs = Array.from(document.querySelectorAll("img.plot"));
  let blank = 0;
  for (const img of imgs) {
    if (!img.naturalWidth || isBlank(img)) blank += 1;
  }
  document.body.dataset.plots = String(imgs.length);
  document.body.dataset.blank = String(blank);
  report();
  document.body.dataset.status = "ready";
}

for (const f of filters) f.addEventListener("change", applyFilters);
fromHash();
applyFilters();
window.addEventListener("load", () => {
  try { check(); } catch (e) { errors.push(String(e)); report(); }
});
"""


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
