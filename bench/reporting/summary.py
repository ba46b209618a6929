"""summary.md: what a reader wants from a run, on one page.

The machine and provenance, the measured ceilings, which backends ran (and why others did
not), the winning backend per paper head and batch for every dtype and pass (with its ratio
to the best peer, bench/harness/peers.py), the torch-vs-baseline ratio at A1 B=256, every backend's
ratio to the best peer, how well auto's dispatch table and the priorities choose
(bench/harness/dispatch_table.py), the kept-fraction sweep (bench/reporting/kept_report.py),
skipped and wrong measurements, and the charts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from bench.reporting import ceilings_report
from bench.reporting.history import machine_kind, write_atomic
from glai_kernels import registry
from glai_kernels.paper_heads import PAPER_HEADS

FOCUS_HEAD, FOCUS_BATCH = "A1", 256

# how bench.harness.timing times a call on each device
_HOW_TIMED = {"cpu": "over interleaved rounds",
              "cuda": "of CUDA-event-timed calls, each after an L2 flush"}


def _cell(row: pd.Series) -> str:
    speedup = row["speedup_vs_baseline"]
    s = f" {speedup:.2f}×" if pd.notna(speedup) else " (baseline not measured)"
    s += _peer_part(row)
    roof = row["roofline_pct"]
    r = f", {roof:.0f}% roof{ceilings_report.flag(roof)}" if pd.notna(roof) else ""
    return f"**{row['backend']}**{s}{r}"


def _peer_part(row: pd.Series) -> str:
    """", 1.31× best peer": the winner's ratio to the fastest peer (bench/harness/peers.py)."""
    ratio = row.get("vs_best_peer")
    return f", {ratio:.2f}× best peer" if pd.notna(ratio) else ""


def _peer_lines(meta: dict) -> list[str]:
    """What each peer is (bench/harness/peers.py): bench-only, never chosen by auto."""
    from bench.harness import peers

    named = [n for n in meta.get("peers", []) if peers.is_peer(n)]
    if not meta.get("peers"):
        return []
    out = ["", "Peers, timed in the same run and checked against the same oracle; the "
           "`peer:` ones are bench-only (not backends: `auto` never returns them):"]
    out += [f"- `{n}`: {peers.PEERS[n].description}" for n in named if n in peers.PEERS]
    out += [f"- `{n}`: the registered backend" for n in meta["peers"] if not peers.is_peer(n)]
    return out


def peer_table(df: pd.DataFrame, dtype: str, pass_: str) -> str | None:
    """Markdown table: per paper head and batch, the best peer (name and median) and every
    backend's ratio to it (above 1× is faster); None without a measured peer."""
    from bench.harness import peers

    sub = df[(df["sweep"] == "heads") & (df["dtype"] == dtype) & (df["pass"] == pass_)
             & (df["status"] == "ok")]
    if sub.empty or sub["vs_best_peer"].isna().all():
        return None
    backends = [b for b in dict.fromkeys(sub["backend"]) if not peers.is_peer(b)]
    lines = ["| head | B | best peer | " + " | ".join(backends) + " |",
             "|---|---|---|" + "---|" * len(backends)]
    for (head, batch), at in sub.groupby(["head", "batch"], sort=False):
        ok = at[at["backend"].map(peers.is_peer_or_backend_peer) & (at["correct"] == True)]  # noqa: E712
        if ok.empty:
            continue
        best = ok.loc[ok["median_s"].idxmin()]
        ratio = dict(zip(at["backend"], at["vs_best_peer"], strict=True))
        cells = [f"{ratio[b]:.2f}×" if pd.notna(ratio.get(b)) else "–" for b in backends]
        lines.append(f"| {head} | {batch} | {best['backend']} {1e3 * best['median_s']:.3g} ms "
                     f"| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    """Roofline predictions from bench/reporting/predict.py (another module's), when it offers
    them."""
    if importlib.util.find_spec("bench.reporting.predict") is None:
        return []
    try:
        from bench.reporting import predict

        text = predict.markdown(predict.predictions())
    except Exception as e:  # its failure must not cost the measured report
        return ["## Roofline predictions", "", f"(bench.reporting.predict failed: {e})", ""]
    if not text:
        return []
    return ["## Roofline predictions (datasheet peaks; predictions, not measurements)", "",
            text, ""]


def render(df: pd.DataFrame, meta: dict, charts: list[str] = ()) -> str:
    """The page; `charts` are the file names under plots/ to show."""
    from bench.reporting import kept_report

    kept_lines = kept_report.markdown(df, meta)
    if "mu" in df:  # the dense op's sections read its rows; the kept-fraction sweep has its own
        df = df[df["mu"].isna() | (df["status"].isin(["wrong", "skipped", "error"]))]
    p, c = meta["provenance"], meta["ceilings"]
    baseline = meta.get("baseline") or registry.baseline().name
    preset = meta["preset"]
    lines = [
        f"# Kernel benchmarks on {machine_kind(p)}",
        "",
        f"`{meta.get('command', 'python -m bench --preset ' + preset['name'])}` on "
        f"{p['device_name']} ({'host: ' if p['device'] != 'cpu' else ''}{p['threads']} "
        f"threads), commit `{p['commit']}`, {p['date']}; "
        f"{meta['elapsed_s']:.0f} s, load average {p.get('load_average', '?')} at the start "
        f"and {p.get('load_average_end', '?')} at the end. Regenerate with the same command "
        f"(or `nox -s bench -- ARGS`). Preset: {preset['description']}.",
        "",
        f"Every number is a median {_HOW_TIMED.get(p['device'], _HOW_TIMED['cpu'])}, with its "
        "interquartile range in "
        f"results.csv; speedups are ratios to the baseline backend ({baseline}) timed in the "
        "same run, and "
        "% of roofline is against ceilings measured in the same run. A backend whose output "
        "misses the float64 oracle is flagged `wrong` and can never win. Method: "
        "[docs/notes/benchmarks.md](../../../docs/notes/benchmarks.md#benchmark-suite).",
        "",
    ]
    if p["device"] == "cpu":
        lines += ["On a CPU shared with other work, absolute times are noisy; read the ratios.",
                  ""]
    if p.get("onednn_guard"):
        lines += [f"**Note:** {p['onednn_guard']}.", ""]
    lines += _merged_lines(meta)
    lines += ["## Machine and provenance", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in p.items()]
    lines += ["", "## Ceilings measured in this run", "", *ceilings_report.table_lines(c)]
    if "measured" in c["details"]:
        lines += ["", f"Each ceiling is {c['details']['measured']}."]
    lines += ["", f"Peak memory: {meta['memory_method']}. Energy: {meta['energy']}.", "",
              "## Backends", "", f"Measured: {', '.join(meta['backends'])}."]
    for name, reason in meta["unavailable"].items():
        lines.append(f"- `{name}` unavailable on {p['device']}: {reason}")
    lines += _peer_lines(meta)
    lines += ["", "## Winning backend per paper head", "",
              "The fastest backend whose outputs matched the float64 oracle, its speedup over "
              f"the baseline ({baseline}), its ratio to the best peer (the fastest of "
              f"{', '.join(meta.get('peers') or ['no peer'])}: what a user would write "
              "instead; above 1× is faster) and its % of the roofline floor.", ""]
    lines += ceilings_report.over_limit_lines(df)
    for dtype in meta["preset"]["dtypes"]:
        for pass_ in ("both", "train", "forward", "backward"):
            t = winners_table(df, dtype, pass_)
            if t:
                lines += [f"### {dtype}, {pass_}", "", t, ""]
    lines += _ratio_line(df[df["mu"].isna()] if "mu" in df else df, baseline)
    peer_tables = [(d, p_, peer_table(df, d, p_)) for d in meta["preset"]["dtypes"]
                   for p_ in ("both", "train", "forward")]
    if any(t for *_, t in peer_tables):
        lines += ["## Every backend against the best peer", "",
                  "Each backend's median over the best peer's (the fastest correct of "
                  f"{', '.join(meta.get('peers') or [])}), paper heads; above 1× is faster "
                  "than what a user would write instead.", ""]
        for d, p_, t in peer_tables:
            if t:
                lines += [f"### {d}, {p_}", "", t, ""]
    from bench.harness import dispatch_table

    lines += dispatch_table.markdown(meta)
    lines += dispatch_table.markdown(meta, dispatch_table.SPARSE)
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
    write_atomic(path, render(df, meta, charts))  # a failed write keeps the old summary
    return path


def _merged_lines(meta: dict) -> list[str]:
    """For a report merged from several runs (bench/reporting/merge.py): which runs, and how to
    read it."""
    runs = meta.get("merged_from") or []
    if not runs:
        return []
    lines = [f"Merged from {len(runs)} runs of this machine kind (`glai-bench merge`; regenerate "
             "with each command, then merge): each row keeps the floor and share from its own "
             "run's ceilings, the ceilings below are the best of the runs', the provenance "
             "table is the first run's.", "", "| run | date | commit | rows | command |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {r['date']} | `{r['commit']}` | {r['rows']} | `{r['command']}` |"
              for n, r in enumerate(runs, 1)]
    return [*lines, ""]
