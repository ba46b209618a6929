"""The report's charts (matplotlib, Agg, ~100 dpi), each from the results table alone.

- roofline.png: achieved GFLOP/s against arithmetic intensity, every backend's points
  under this run's measured physical ceilings (one panel per dtype), the library GEMM's rate
  as a dotted reference line.
- speedup_heads.png: speedup over the baseline backend, heads × batch, one heatmap per
  backend; below it, when peers ran (bench/harness/peers.py), the ratio to the best peer.
- speedup_sweeps.png: speedup over the baseline along each one-axis sweep, backends × values;
  beside it, when peers ran, the ratio to the best peer.
- time_vs_batch.png: median time per call against batch, one line per backend, per head.
- fwd_bwd_split.png: forward and backward time per backend at each head, stacked.
- kept_fraction.png: the kept-fraction sweep (bench/harness/kept.py): time against μ per head,
  log-log, a line per backend and batch, the MLP as a horizontal line, the crossover of
  best sparse and best dense marked; forward and training-step panels.
Speedup and time charts show the pass forward+backward ("both") in the first dtype of the
run unless the run has no such pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.patches
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm, TwoSlopeNorm

from bench.harness.ceilings import LIBRARY_GEMM, Ceilings
from bench.harness.results import PEER_COLUMN
from glai_kernels import registry
from glai_kernels.paper_heads import PAPER_HEADS

DPI = 100
MARKERS = {"forward": "o", "backward": "s", "both": "^", "train": "D"}
LINESTYLES = ("-", "--", ":", "-.")


def _saved(fig, path: Path) -> Path:
    """Write `fig` to `path` at the charts' resolution and free it."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _colors(backends: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {b: cmap(i % 10) for i, b in enumerate(backends)}


def _subtitle(meta: dict) -> str:
    p = meta["provenance"]
    return (f"{p['machine']} ({p['device_name']}), {p['threads']} threads, torch "
            f"{p['torch_version']}, commit {str(p['commit'])[:10]}, {p['date'][:10]}")


def _focus(df: pd.DataFrame) -> tuple[str, str]:
    """The (pass, dtype) the speedup and time charts show."""
    passes = list(df["pass"].unique())
    pass_ = "both" if "both" in passes else passes[0]
    return pass_, str(df["dtype"].iloc[0])


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def roofline(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    timed = df[df["status"].isin(["ok", "wrong"])].drop_duplicates(
        ["backend", "batch", "inputs", "paths", "outputs", "dtype", "pass"])
    if timed.empty:
        return None
    dtypes = list(dict.fromkeys(timed["dtype"]))
    colors = _colors(list(dict.fromkeys(df["backend"])))
    ceil = Ceilings(**meta["ceilings"])
    bw = ceil.bandwidth(2**62)[0] / 1e9  # main memory's: no case fits in cache at that size
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes) + 1.5, 5),
                             squeeze=False, layout="constrained")
    for ax, dtype in zip(axes[0], dtypes, strict=True):
        sub = timed[timed["dtype"] == dtype]
        peak, how = ceil.compute_peak(dtype)
        peak /= 1e9
        lo = min(sub["intensity"].min(), peak / bw) / 3
        hi = max(sub["intensity"].max(), peak / bw) * 3
        xs = np.geomspace(lo, hi, 200)
        what = "physical peak" if how != LIBRARY_GEMM else f"{LIBRARY_GEMM} (no physical peak)"
        ax.plot(xs, np.minimum(peak, xs * bw), color="black", lw=2,
                label=f"ceiling: {peak:.0f} GFLOP/s {what}, {bw:.0f} GB/s memory")
        cache_bw = ceil.bandwidth(1)[0] / 1e9 if ceil.cache_bytes else math.nan
        if math.isfinite(cache_bw) and (sub["bound"] == "cache").any():
            ax.plot(xs, np.minimum(peak, xs * cache_bw), color="black", lw=1, ls="--",
                    label=f"cache ceiling: {cache_bw:.0f} GB/s (data fitting in cache)")
        l2_bw = ceil.l2_triad_bytes_per_s / 1e9
        if math.isfinite(l2_bw) and (sub["bound"] == "L2").any():
            ax.plot(xs, np.minimum(peak, xs * l2_bw), color="black", lw=1, ls="-.",
                    label=f"L2 ceiling: {l2_bw:.0f} GB/s (data fitting in the threads' L2)")
        gemm = ceil.matmul_flops.get(dtype, math.nan) / 1e9
        if how != LIBRARY_GEMM and math.isfinite(gemm):
            ax.axhline(gemm, color="gray", lw=1, ls=":",
                       label=f"{LIBRARY_GEMM}: {gemm:.0f} GFLOP/s (torch.mm, reference)")
        for (backend, pass_), g in sub.groupby(["backend", "pass"], sort=False):
            wrong = g["status"] == "wrong"
            ax.scatter(g.loc[~wrong, "intensity"], g.loc[~wrong, "gflops"], s=28, alpha=0.8,
                       color=colors[backend], marker=MARKERS.get(pass_, "o"))
            if wrong.any():
                ax.scatter(g.loc[wrong, "intensity"], g.loc[wrong, "gflops"], s=60,
                           facecolors="none", edgecolors="red", marker=MARKERS.get(pass_, "o"))
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)",
               ylabel="achieved GFLOP/s", title=f"{dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")  # the ceiling lines
    # backends and passes once, beside the panels, where they hide no point
    markers = [plt.Line2D([], [], color=colors[b], marker="o", ls="", label=b)
               for b in dict.fromkeys(timed["backend"])]
    markers += [plt.Line2D([], [], color="gray", marker=MARKERS.get(p, "o"), ls="", label=p)
                for p in dict.fromkeys(timed["pass"])]
    if (timed["status"] == "wrong").any():
        markers.append(plt.Line2D([], [], marker="o", ls="", markerfacecolor="none",
                                  markeredgecolor="red", label="wrong result"))
    fig.legend(handles=markers, fontsize=8, loc="outside right center")
    fig.suptitle(f"Roofline: every measurement under this run's ceilings\n{_subtitle(meta)}",
                 fontsize=10)
    return _saved(fig, path)


def _heatmap(ax, grid: pd.DataFrame, title: str, xlabel: str, ylabel: str, norm):
    values = grid.to_numpy(dtype=float)
    im = ax.imshow(np.ma.masked_invalid(values), cmap="RdYlGn", norm=norm, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index])
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    for (r, c), v in np.ndenumerate(values):
        ax.text(c, r, "–" if np.isnan(v) else f"{v:.2g}×", ha="center", va="center", fontsize=8)
    return im


def _speedup_norm(values: pd.Series):
    finite = values[np.isfinite(values) & (values > 0)]
    if finite.empty:
        return TwoSlopeNorm(vcenter=1.0, vmin=0.5, vmax=2.0)
    span = max(float(finite.max()), 1 / float(finite.min()), 1.01)
    return LogNorm(vmin=1 / span, vmax=span)


def _baseline(meta: dict) -> str:
    """The backend the run's speedups are over (results.json's "baseline")."""
    return meta.get("baseline") or registry.baseline().name


def _speedup_colorbar(fig, im, axes, baseline: str) -> None:
    bar = fig.colorbar(im, ax=axes, label=f"speedup over {baseline} (same run)")
    lo, hi = im.norm.vmin, im.norm.vmax
    ticks = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)
             if lo * (1 - 1e-6) <= 2.0**k <= hi * (1 + 1e-6)]
    bar.set_ticks(ticks, labels=[f"{t:g}×" for t in ticks])
    bar.ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _has_peer_ratio(sub: pd.DataFrame) -> bool:
    return PEER_COLUMN in sub and sub[PEER_COLUMN].notna().any()


def _speedup_metrics(ok: pd.DataFrame, meta: dict) -> list[tuple[str, str]]:
    """(column, label) of each speedup chart's rows or columns of panels: the speedup over the
    baseline, then, when peers ran (`ok` holds a ratio to the best one), that ratio."""
    metrics = [("speedup_vs_baseline", f"over {_baseline(meta)}")]
    if _has_peer_ratio(ok):
        metrics.append((PEER_COLUMN, "over the best peer"))
    return metrics


def _speedup_panels(fig, values: pd.Series, label: str, panels: list) -> None:
    """One metric's heatmaps, panels [(ax, grid, title, xlabel, ylabel)], on one color
    scale spanning `values`, with one colorbar beside them all."""
    norm = _speedup_norm(values)
    im = None
    for ax, grid, title, xlabel, ylabel in panels:
        im = _heatmap(ax, grid, title, xlabel, ylabel, norm)
    _speedup_colorbar(fig, im, [panel[0] for panel in panels], label.removeprefix("over "))


def speedup_heads(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    """Heads × batch heatmaps per backend: the speedup over the baseline (top row) and, when
    peers ran, the ratio to the best peer (bottom row, bench/harness/peers.py)."""
    pass_, dtype = _focus(df)
    sub = _ok(df[(df["sweep"] == "heads") & (df["pass"] == pass_) & (df["dtype"] == dtype)
                 & (df["backend"] != _baseline(meta))])
    if sub.empty:
        return None
    backends = list(dict.fromkeys(sub["backend"]))
    metrics = _speedup_metrics(sub, meta)
    fig, axes = plt.subplots(len(metrics), len(backends), squeeze=False, layout="constrained",
                             figsize=(max(8, 4.2 * len(backends) + 1), 4.5 * len(metrics)))
    for row, (column, label) in enumerate(metrics):
        panels = []
        for ax, backend in zip(axes[row], backends, strict=True):
            grid = (df[(df["sweep"] == "heads") & (df["pass"] == pass_)
                       & (df["dtype"] == dtype) & (df["backend"] == backend)]
                    .pivot_table(index="head", columns="batch", values=column,
                                 aggfunc="first", dropna=False))
            panels.append((ax, grid, f"{backend}, {label}", "batch B", "head"))
        _speedup_panels(fig, sub[column], label, panels)
    peers = (f"; best peer: fastest of {', '.join(meta.get('peers', []))}"
             if len(metrics) > 1 else "")
    also = " and the best peer" if peers else ""
    fig.suptitle(f"Speedup over the {_baseline(meta)} baseline{also}, paper heads, {pass_} pass, "
                 f"{dtype} (– = not measured{peers})\n"
                 f"{_subtitle(meta)}", fontsize=10)
    return _saved(fig, path)


def speedup_sweeps(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    """Backends × values heatmaps per one-axis sweep: the speedup over the baseline (left)
    and, when peers ran, the ratio to the best peer (right)."""
    pass_, dtype = _focus(df)
    sub = df[(df["sweep"] != "heads") & (df["pass"] == pass_) & (df["dtype"] == dtype)
             & (df["backend"] != _baseline(meta))]
    sweeps = list(dict.fromkeys(sub["sweep"]))
    if _ok(sub).empty:
        return None
    metrics = _speedup_metrics(_ok(sub), meta)
    height = 1.5 + len(sweeps) * (0.6 + 0.45 * sub["backend"].nunique())
    fig, axes = plt.subplots(len(sweeps), len(metrics), figsize=(9 * len(metrics), height),
                             squeeze=False, layout="constrained")
    axis_of = {"batch": "batch", "inputs": "inputs", "paths": "paths", "outputs": "outputs"}
    for col, (column, label) in enumerate(metrics):
        panels = []
        for ax, sweep in zip(axes[:, col], sweeps, strict=True):
            axis = axis_of[sweep.split("@")[0]]
            grid = sub[sub["sweep"] == sweep].pivot_table(index="backend", columns=axis,
                                                         values=column, aggfunc="first",
                                                         dropna=False)
            panels.append((ax, grid, f"{sweep}, {label}", axis, ""))
        _speedup_panels(fig, _ok(sub)[column], label, panels)
    fig.suptitle(f"Speedup over {_baseline(meta)}"
                 f"{' and over the best peer' if len(metrics) > 1 else ''} along each one-axis "
                 f"sweep, {pass_} pass, {dtype}\n{_subtitle(meta)}", fontsize=10)
    return _saved(fig, path)


def time_vs_batch(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    pass_, dtype = _focus(df)
    sub = _ok(df[(df["dtype"] == dtype) & df["pass"].isin([pass_, "forward"])])
    # every measurement at a paper head's own I, P, O, from whichever sweep it came
    native = pd.Series(False, index=sub.index)
    for name, head in PAPER_HEADS.items():
        native |= ((sub["head"] == name) & (sub["inputs"] == head.inputs)
                   & (sub["paths"] == head.paths) & (sub["outputs"] == head.outputs))
    sub = sub[native].drop_duplicates(["head", "backend", "pass", "batch"])
    heads = [h for h, g in sub.groupby("head", sort=False) if g["batch"].nunique() >= 2]
    sub = sub[sub["head"].isin(heads)]
    if sub.empty:
        return None
    colors = _colors(list(dict.fromkeys(df["backend"])))
    cols = min(3, len(heads))
    rows = math.ceil(len(heads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(9, 4.5 * cols), 3.6 * rows + 0.6),
                             squeeze=False, layout="constrained")
    for ax, head in zip(axes.flat, heads, strict=False):
        h = sub[sub["head"] == head]
        for (backend, p), g in h.groupby(["backend", "pass"], sort=False):
            g = g.sort_values("batch")
            ms = 1e3 * g["median_s"]
            ax.errorbar(g["batch"], ms, yerr=[ms - 1e3 * g["q25_s"], 1e3 * g["q75_s"] - ms],
                        color=colors[backend], ls="-" if p == pass_ else "--", marker="o", ms=3,
                        label=f"{backend} {p}")
        ax.set(xscale="log", yscale="log", title=head, xlabel="batch B", ylabel="ms per call")
        batches = sorted(h["batch"].unique())
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    fig.suptitle(f"Time per call against batch (median, IQR bars), {dtype}; solid = {pass_}, "
                 f"dashed = forward\n{_subtitle(meta)}", fontsize=10)
    return _saved(fig, path)


def fwd_bwd_split(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    _, dtype = _focus(df)
    heads = _ok(df[(df["sweep"] == "heads") & (df["dtype"] == dtype)])
    f = heads[heads["pass"] == "forward"]
    b = heads[heads["pass"] == "backward"]
    if f.empty or b.empty:
        return None
    both = heads[heads["pass"] == "both"]
    key = ["head", "batch", "backend"]
    merged = f[[*key, "median_s"]].merge(b[[*key, "median_s"]], on=key,
                                         suffixes=("_fwd", "_bwd"))
    merged = merged.merge(both[[*key, "median_s"]], on=key, how="left")
    if merged.empty:
        return None
    # one batch per head: the largest at which the most backends were measured
    batch = {h: max(g.groupby("batch").size().items(), key=lambda kv: (kv[1], kv[0]))[0]
             for h, g in merged.groupby("head")}
    merged = merged[merged.apply(lambda r: r["batch"] == batch[r["head"]], axis=1)]
    backends = [b for b in meta.get("backends", []) if b in set(merged["backend"])] or list(
        dict.fromkeys(merged["backend"]))
    colors = _colors(list(dict.fromkeys(df["backend"])))
    heads_order = list(dict.fromkeys(merged["head"]))
    fig, axes = plt.subplots(1, len(heads_order), figsize=(max(9, 2.6 * len(heads_order) + 1),
                                                           4.5),
                             squeeze=False, layout="constrained")
    for ax, head in zip(axes[0], heads_order, strict=True):
        h = merged[merged["head"] == head].set_index("backend").reindex(backends)
        x = np.arange(len(backends))
        fwd, bwd = 1e3 * h["median_s_fwd"], 1e3 * h["median_s_bwd"]
        ax.bar(x, fwd, color=[colors[b] for b in backends], alpha=0.5, label="forward")
        ax.bar(x, bwd, bottom=fwd, color=[colors[b] for b in backends], label="backward")
        ax.scatter(x, 1e3 * h["median_s"], color="black", marker="_", s=200, zorder=3,
                   label="both, measured")
        for xi, missing in zip(x, (fwd.isna() | bwd.isna()).to_numpy(), strict=True):
            if missing:
                ax.text(xi, 0, "not\nmeasured", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, backends, rotation=45, ha="right")
        ax.set(title=f"{head}, B={batch[head]}", ylabel="ms per call")
    axes[0][0].legend(handles=[
        matplotlib.patches.Patch(color="gray", alpha=0.5, label="forward"),
        matplotlib.patches.Patch(color="gray", label="backward"),
        plt.Line2D([], [], color="black", marker="_", ms=12, ls="", label="both, measured")],
        fontsize=7)
    fig.suptitle(f"Forward (light) and backward (dark, all three gradients) time, {dtype}; "
                 f"bar = both measured in one call\n{_subtitle(meta)}", fontsize=10)
    return _saved(fig, path)


def kept_fraction(df: pd.DataFrame, meta: dict, path: Path) -> Path | None:
    from bench.reporting import kept_report

    rows = kept_report.kept_rows(df)
    if rows.empty:
        return None
    heads = list(dict.fromkeys(rows["head"]))
    passes = [p for p in ("forward", "step") if p in set(rows["pass"])]
    batches = sorted(rows["batch"].unique())
    styles = {b: LINESTYLES[k % len(LINESTYLES)] for k, b in enumerate(batches)}
    colors = _colors([b for b in dict.fromkeys(rows["backend"]) if b != "mlp"])
    fig, axes = plt.subplots(len(heads), len(passes), squeeze=False, layout="constrained",
                             figsize=(5.5 * len(passes) + 2, 3.2 * len(heads) + 0.8))
    for row, head in enumerate(heads):
        for col, pass_ in enumerate(passes):
            ax = axes[row][col]
            sub = rows[(rows["head"] == head) & (rows["pass"] == pass_)]
            for batch in batches:
                at = sub[sub["batch"] == batch]
                if at.empty:
                    continue
                pruned = kept_report.at_match(at)
                for backend, g in at[at["backend"] != "mlp"].groupby("backend", sort=False):
                    g = g.sort_values("mu")
                    line = g[~pruned.loc[g.index]]
                    ax.plot(100 * line["mu"], 1e3 * line["median_s"], marker="o", ms=3,
                            color=colors[backend], ls=styles[batch])
                    point = g[pruned.loc[g.index]]
                    ax.plot(100 * point["mu"], 1e3 * point["median_s"], marker="*", ms=9,
                            ls="none", color=colors[backend])
                mlp = at[at["backend"] == "mlp"]["median_s"]
                if len(mlp):
                    ax.axhline(1e3 * mlp.median(), color="black", ls=styles[batch], lw=1)
                mu, _ = kept_report.crossover(at[~pruned])
                if mu is not None:
                    ax.axvline(100 * mu, color="red", ls=styles[batch], lw=1)
                    ax.annotate(f"{100 * mu:.2g}%", (100 * mu, 1), xycoords=("data", "axes "
                                "fraction"), fontsize=7, color="red", ha="left", va="top")
            matched = sub[sub["nnz"] == kept_report.matched_keep(PAPER_HEADS[head])]["mu"]
            if len(matched):
                ax.axvline(100 * matched.iloc[0], color="0.6", lw=3, alpha=0.4)
            ax.set(xscale="log", yscale="log", title=f"{head}, {pass_}",
                   xlabel="kept fraction μ (%)", ylabel="ms per call")
            ax.grid(True, which="both", alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ms=3, label=b) for b, c in colors.items()]
    handles += [plt.Line2D([], [], color="black", lw=1, label="MLP (n0, n1, n2)"),
                plt.Line2D([], [], color="red", lw=1, label="crossover: best sparse = best dense"),
                plt.Line2D([], [], color="0.6", lw=3, alpha=0.4, label="matched μ"),
                plt.Line2D([], [], color="gray", marker="*", ms=9, ls="none",
                           label="the pruned head (matched μ); lines: random masks")]
    handles += [plt.Line2D([], [], color="gray", ls=styles[b], label=f"B = {b}")
                for b in batches]
    fig.legend(handles=handles, fontsize=8, loc="outside right center")
    fig.suptitle(f"Time per call against the kept fraction μ (median; forward = estimator "
                 f"alone, step = whole training step)\n{_subtitle(meta)}", fontsize=10)
    return _saved(fig, path)


CHARTS = {
    "roofline.png": roofline,
    "speedup_heads.png": speedup_heads,
    "speedup_sweeps.png": speedup_sweeps,
    "time_vs_batch.png": time_vs_batch,
    "fwd_bwd_split.png": fwd_bwd_split,
    "kept_fraction.png": kept_fraction,
}


def write_all(df: pd.DataFrame, meta: dict, out_dir: Path) -> list[Path]:
    """Every chart the table has data for; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    # the dense op's charts read the dense op's rows; the kept-fraction sweep's (with a mu)
    # have their own chart, and their points join the roofline
    dense = df[df["mu"].isna()] if "mu" in df else df
    for name, chart in CHARTS.items():
        rows = df if name in ("roofline.png", "kept_fraction.png") else dense
        path = chart(rows, meta, out_dir / name) if not rows.empty else None
        if path is not None:
            written.append(path)
        elif (out_dir / name).exists():
            (out_dir / name).unlink()  # a stale chart from an earlier run would mislead
    return written
