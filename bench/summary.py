"""summary.md: what a reader wants from a run, on one page.

The machine and provenance, the measured ceilings, which backends ran (and why others did
not), the winning backend per paper head and batch for every dtype and pass, the
torch-vs-baseline ratio at A1 B=256, the kept-fraction sweep (bench/kept_report.py),
skipped and wrong measurements, and the charts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from bench import ceilings_report
from glai_kernels import registry
from glai_kernels.paper_heads import PAPER_HEADS

FOCUS_HEAD, FOCUS_BATCH = "A1", 256


def _cell(row: pd.Series) -> str:
    speedup = row["speedup_vs_baseline"]
    s = f" {speedup:.2f}×" if pd.notna(speedup) else " (baseline not measured)"
    roof = row["roofline_pct"]
    r = f", {roof:.0f}% roof{ceilings_report.flag(roof)}" if pd.notna(roof) else ""
    return f"**{row['backend']}**{s}{r}"


def winners_table(df: pd.DataFrame, dtype: str, pass_: str) -> str | None:
    """Markdown table: heads × batch, the fastest correct backend, its speedup over the
    baseline backend and % of roofline."""
    sub = df[(df["sweep"] == "heads") & (df["dtype"] == dtype) & (df["pass"] == pass_)]
    if sub.empty:
        return None
    batches = sorted(sub["batch"].unique())
    lines = ["| head | " + " | ".join(f"B={b}" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for head, h in sub.groupby("head", sort=False):
        cells = []
        for b in batches:
            at = h[h["batch"] == b]
            win = at[at["winner"] == True]  # noqa: E712
            if not win.empty:
                cells.append(_cell(win.iloc[0]))
            elif (at["status"] == "skipped").all():
                cells.append("skipped")
            else:
                cells.append("no correct result")
        lines.append(f"| {head} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio_line(df: pd.DataFrame, baseline: str) -> list[str]:
    shape = PAPER_HEADS[FOCUS_HEAD].shape(FOCUS_BATCH).as_dict()
    at = (df[list(shape)] == pd.Series(shape)).all(axis=1)
    sub = df[at & (df["backend"] == "torch") & (df["status"] == "ok")].drop_duplicates(
        ["dtype", "pass"])
    if sub.empty:
        return []
    out = [f"## torch against {baseline} at {FOCUS_HEAD}, B={FOCUS_BATCH}", "",
           f"| dtype | pass | torch / {baseline} speedup (medians, same run) | torch median "
           f"| IQR |",
           "|---|---|---|---|---|"]
    for _, r in sub.iterrows():
        out.append(f"| {r['dtype']} | {r['pass']} | {r['speedup_vs_baseline']:.2f}× | "
                   f"{1e3 * r['median_s']:.3g} ms | {1e3 * r['iqr_s']:.2g} ms |")
    return [*out, ""]


def _predictions() -> list[str]:
    """Roofline predictions from bench/predict.py (another module's), when it offers them."""
    if importlib.util.find_spec("bench.predict") is None:
        return []
    try:
        from bench import predict

        text = predict.markdown() if hasattr(predict, "markdown") else None
    except Exception as e:  # its failure must not cost the measured report
        return ["## Roofline predictions", "", f"(bench.predict failed: {e})", ""]
    if not text:
        return []
    return ["## Roofline predictions (datasheet peaks; predictions, not measurements)", "",
            text, ""]


def render(df: pd.DataFrame, meta: dict, charts: list[str] = ()) -> str:
    """The page; `charts` are the file names under plots/ to show."""
    from bench import kept_report

    kept_lines = kept_report.markdown(df, meta)
    if "mu" in df:  # the dense op's sections read its rows; the kept-fraction sweep has its own
        df = df[df["mu"].isna() | (df["status"].isin(["wrong", "skipped", "error"]))]
    p, c = meta["provenance"], meta["ceilings"]
    baseline = meta.get("baseline") or registry.baseline().name
    preset = meta["preset"]
    lines = [
        f"# Kernel benchmarks on {p['machine']}",
        "",
        f"`{meta.get('command', 'python -m bench --preset ' + preset['name'])}` on "
        f"{p['device_name']} ({p['threads']} threads), commit `{p['commit']}`, {p['date']}; "
        f"{meta['elapsed_s']:.0f} s, load average {p.get('load_average', '?')} at the start "
        f"and {p.get('load_average_end', '?')} at the end. Regenerate with the same command "
        f"(or `nox -s bench -- ARGS`). Preset: {preset['description']}.",
        "",
        "Every number is a median over interleaved rounds with its interquartile range in "
        f"results.csv; speedups are ratios to the baseline backend ({baseline}) timed in the "
        "same run, and "
        "% of roofline is against ceilings measured in the same run. A backend whose output "
        "misses the float64 oracle is flagged `wrong` and can never win. Method: "
        "[bench/NOTES.md](../../../bench/NOTES.md#benchmark-suite).",
        "",
    ]
    if p["device"] == "cpu":
        lines += ["On a CPU shared with other work, absolute times are noisy; read the ratios.",
                  ""]
    lines += ["## Machine and provenance", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in p.items()]
    lines += ["", "## Ceilings measured in this run", "", *ceilings_report.table_lines(c)]
    if "measured" in c["details"]:
        lines += ["", f"Each ceiling is {c['details']['measured']}."]
    lines += ["", f"Peak memory: {meta['memory_method']}. Energy: {meta['energy']}.", "",
              "## Backends", "", f"Measured: {', '.join(meta['backends'])}."]
    for name, reason in meta["unavailable"].items():
        lines.append(f"- `{name}` unavailable on {p['device']}: {reason}")
    lines += ["", "## Winning backend per paper head", "",
              "The fastest backend whose outputs matched the float64 oracle, its speedup over "
              f"the baseline ({baseline}) and its % of the roofline floor.", ""]
    lines += ceilings_report.over_limit_lines(df)
    for dtype in meta["preset"]["dtypes"]:
        for pass_ in ("both", "train", "forward", "backward"):
            t = winners_table(df, dtype, pass_)
            if t:
                lines += [f"### {dtype}, {pass_}", "", t, ""]
    lines += _ratio_line(df[df["mu"].isna()] if "mu" in df else df, baseline)
    lines += kept_lines
    wrong = df[df["status"] == "wrong"].drop_duplicates(
        ["backend", "batch", "inputs", "paths", "outputs", "dtype", "pass",
         *(["mu"] if "mu" in df else [])])
    lines += ["## Wrong results", ""]
    if wrong.empty:
        lines.append("None: every timed output matched the float64 oracle.")
    for _, r in wrong.iterrows():
        mu = f" μ={100 * r['mu']:.3g}%" if pd.notna(r.get("mu")) else ""
        lines.append(f"- {r['backend']} {r['pass']} {r['dtype']} B={r['batch']} "
                     f"I={r['inputs']} P={r['paths']} O={r['outputs']}{mu}: {r['note']}")
    skipped = df[df["status"].isin(["skipped", "error"])]
    lines += ["", "## Skipped or failed", ""]
    if skipped.empty:
        lines.append("Nothing.")
    else:
        counts = skipped.groupby(["status", "note"]).size().reset_index(name="rows")
        lines += ["| status | note | rows |", "|---|---|---|"]
        lines += [f"| {r['status']} | {r['note']} | {r['rows']} |" for _, r in counts.iterrows()]
    lines += ["", *_predictions(), "## Charts", ""]
    if not charts:
        lines.append("No charts in this run.")
    for name in charts:
        lines += [f"![{name}](plots/{name})", ""]
    return "\n".join(lines)


def write(df: pd.DataFrame, meta: dict, out_dir: Path) -> Path:
    path = out_dir / "summary.md"
    charts = sorted(p.name for p in (out_dir / "plots").glob("*.png"))
    path.write_text(render(df, meta, charts))
    return path
