"""What the gate prints: the comparison as Markdown, and a new baseline's spreads."""

from __future__ import annotations

import math

import pandas as pd

from bench.gate.stats import Comparison
from bench.reporting.history import slug


def _pct(log: float) -> str:
    return f"{100 * math.expm1(log):+.1f}%"


def _drop(threshold: float) -> str:
    """A log-scale threshold as the fall in the ratio it allows, e.g. "-13.9%"."""
    return f"-{100 * -math.expm1(-threshold):.1f}%"


ADVICE = ("If the slowdown is intended, accept a new baseline on purpose: "
          "`nox -s gate -- accept` (see docs/notes/gate.md, 'Regression gate').")


def report(verdict: Comparison, baseline: dict, *, limit: int = 40, title: str | None = None,
           advice: str = ADVICE) -> str:
    """A Markdown table of what regressed (or a one-line all-clear), with the noise beside it;
    `title` replaces the committed baseline's heading (the paired gate's), `advice` the
    closing line of a failure."""
    n_case = int((verdict.table["level"] == "case").sum())
    head = (f"regression gate against reports/baseline/{slug(baseline['machine'])}.json "
            f"({baseline['n_runs']} baseline runs; thresholds {baseline['margin']}× the largest "
            f"spread seen, at least {100 * baseline['case_floor']:.0f}% per case and "
            f"{100 * baseline['group_floor']:.0f}% per backend)")
    lines = [title or head]
    if verdict.missing:
        lines.append(f"note: {len(verdict.missing)} baseline measurements absent from this run "
                     f"(unavailable backend or skipped case); first: {verdict.missing[0]}")
    watched = verdict.table[verdict.table["beyond"] & ~verdict.table["gated"]]
    if len(watched):
        names = sorted({f"{r['backend']} {r['head']} {r['pass']}" for _, r in watched.iterrows()})
        lines.append(f"watch (not gated): {len(watched)} roofline shares beyond their "
                     f"thresholds: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
    if verdict.ok:
        table = verdict.table[verdict.table["gated"]]
        text = (f"PASS: {len(table)} gated ratios (speedups per case and per backend, the "
                f"oracle's roofline share) within thresholds")
        if n_case and len(table):
            w = table.loc[table["log_dev"].idxmin()]
            text += (f"; the largest drop {_pct(w['log_dev'])} ({w['backend']} {w['head']} "
                     f"{w['shape']} {w['pass']} {w['metric']}, threshold {_drop(w['threshold'])}")
            if w["beyond"]:
                # only a case's speedup passes beyond its threshold (stats._confirmed_by_its_share)
                text += ("; beyond it, but the backend held its roofline share there: the "
                         "oracle ran faster, the backend no slower")
            text += ")"

        lines.append(text)
        return "\n".join(lines)
    # per-backend medians first: they say which backend; the cases then say where
    failed = verdict.failed.sort_values(["level", "log_dev"], ascending=[False, True])
    lines += [f"FAIL: {len(failed)} ratios fell beyond their thresholds", "",
              "| check | backend | head | shape | dtype | pass | ratio | baseline | now | change "
              "| threshold | noise (max seen) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in failed.head(limit).iterrows():
        base = "" if pd.isna(r.get("median")) else f"{r['median']:.3g}"
        now = "" if pd.isna(r.get("value")) else f"{r['value']:.3g}"
        lines.append(f"| {r['level']} | {r['backend']} | {r['head']} | {r['shape']} | "
                     f"{r['dtype']} | {r['pass']} | {r['metric']} | {base} | {now} | "
                     f"{r['change_pct']:+.1f}% | {_drop(r['threshold'])} | "
                     f"±{100 * math.expm1(r['noise']):.1f}% |")
    if len(failed) > limit:
        lines.append(f"... and {len(failed) - limit} more")
    lines += ["", advice]
    return "\n".join(lines)


def spread_summary(baseline: dict) -> str:
    """The measured spread and the thresholds set from it, as Markdown."""
    lines = [f"baseline for {baseline['machine']} from {baseline['n_runs']} runs "
             f"(load averages {baseline['load_averages']})", "",
             "| metric | per case: largest spread | median case's spread | per backend: "
             "largest spread of the median | median backend's spread |",
             "|---|---|---|---|---|"]
    for metric, s in baseline["spread"].items():
        lines.append(f"| {metric} | ±{100 * math.expm1(s['case_max']):.1f}% | "
                     f"±{100 * math.expm1(s['case_median']):.1f}% | "
                     f"±{100 * math.expm1(s['group_max']):.1f}% | "
                     f"±{100 * math.expm1(s['group_median']):.1f}% |")
    thresholds = sorted(e["threshold"] for e in baseline["entries"])
    lines += ["", f"case thresholds: {_drop(thresholds[0])} to {_drop(thresholds[-1])}, "
                  f"median {_drop(thresholds[len(thresholds) // 2])}", "",
              "| backend | dtype | pass | metric | cases | spread of the median | threshold |",
              "|---|---|---|---|---|---|---|"]
    for g in baseline["groups"]:
        lines.append(f"| {g['backend']} | {g['dtype']} | {g['pass']} | {g['metric']} | "
                     f"{g['cases']} | ±{100 * math.expm1(g['spread']):.1f}% | "
                     f"{_drop(g['threshold'])} |")
    return "\n".join(lines)


