"""The gate's statistics: one run's gated ratios, a baseline's spreads and thresholds from N
runs, and the comparison of a run (or the best of several) with a baseline.

    ratios(results)                  long table (RATIO_KEY..., metric, value) of one run
    thresholds_from([tables], ...)   {"spread", "groups", "entries"} of a baseline
    compare(results, baseline)       a Comparison: every (case or group, metric) compared
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from glai_kernels import registry

METRICS: tuple[str, ...] = ("speedup_best", "roofline_best_pct")
# one measurement whose ratios the gate compares (a baseline entry is this plus the metric)
RATIO_KEY: tuple[str, ...] = ("backend", "head", "batch", "inputs", "paths", "outputs", "dtype",
                              "pass")
GROUP_KEY: tuple[str, ...] = ("backend", "dtype", "pass")


def oracle_name() -> str:
    """The backend every speedup is measured against (the registry's baseline)."""
    return registry.baseline().name


def ratios(results: dict | pd.DataFrame) -> pd.DataFrame:
    """Long table (RATIO_KEY..., metric, value) of one run's gated ratios.

    `results` is a results.json dict or the results table. Only measurements that ran and
    matched the oracle count; the oracle's own speedup (1 by definition) is left out.
    """
    df = pd.DataFrame(results["rows"]) if isinstance(results, dict) else results
    df = df[(df["status"] == "ok") & (df["correct"] == True)].copy()  # noqa: E712
    df = df.drop_duplicates(list(RATIO_KEY))
    # floor / min_s, from the columns every results row has
    df["roofline_best_pct"] = (df["roofline_pct"].astype(float) * df["median_s"].astype(float)
                               / df["min_s"].astype(float))
    long = df.melt(id_vars=list(RATIO_KEY), value_vars=list(METRICS), var_name="metric")
    long = long[~((long["backend"] == oracle_name()) & (long["metric"] == "speedup_best"))]
    long["value"] = long["value"].astype(float)
    long = long[np.isfinite(long["value"]) & (long["value"] > 0)]
    return long.astype({"batch": int, "inputs": int, "paths": int,
                        "outputs": int}).reset_index(drop=True)


def _group_medians(dev: pd.DataFrame) -> pd.DataFrame:
    """Median log-deviation and case count per (run, group, metric) of a `log_dev` table."""
    keys = [k for k in ("run", *GROUP_KEY, "metric") if k in dev]
    return dev.groupby(keys, as_index=False).agg(log_dev=("log_dev", "median"),
                                                 n=("log_dev", "size"))


def thresholds_from(tables: list[pd.DataFrame], *, margin: float, case_floor: float,
                    group_floor: float) -> dict:
    """The baseline's statistics from N runs' `ratios` tables: {"spread", "groups",
    "entries"} (each entry keeps every run's value, so `run_tables` can recover the runs)."""
    table = pd.concat([t.assign(run=i) for i, t in enumerate(tables)], ignore_index=True)
    keys = [*RATIO_KEY, "metric"]
    # only what every run measured: a case some runs skipped has no spread to judge it by
    counts = table.groupby(keys)["run"].transform("nunique")
    table = table[counts == len(tables)].copy()
    median = table.groupby(keys)["value"].transform("median")
    table["log_dev"] = np.log(table["value"] / median)
    groups = _group_medians(table)

    spreads = {}
    for metric in METRICS:
        case_dev = (table[table["metric"] == metric].groupby(list(RATIO_KEY))["log_dev"]
                    .agg(lambda d: d.abs().max()))
        group_dev = groups.loc[groups["metric"] == metric, "log_dev"].abs()
        spreads[metric] = {"case_max": float(case_dev.max()),
                           "case_median": float(case_dev.median()),
                           "group_max": float(group_dev.max()),
                           "group_median": float(group_dev.median())}
    group_entries = []
    for key, sub in groups.groupby([*GROUP_KEY, "metric"], sort=True):
        spread = float(sub["log_dev"].abs().max())
        group_entries.append({**dict(zip([*GROUP_KEY, "metric"], key, strict=True)),
                              "cases": int(sub["n"].iloc[0]), "spread": spread,
                              "threshold": max(group_floor, margin * spread)})
    entries = []
    for key, sub in table.groupby(keys, sort=True):
        entry = dict(zip(keys, key, strict=True))
        entry = {k: (int(v) if isinstance(v, np.integer) else v) for k, v in entry.items()}
        spread = float(sub["log_dev"].abs().max())
        entry.update(median=float(sub["value"].median()), spread=spread,
                     threshold=max(case_floor, margin * spread),
                     runs=[round(float(v), 6) for v in sub.sort_values("run")["value"]])
        entries.append(entry)
    return {"spread": spreads, "groups": group_entries, "entries": entries}


def run_tables(baseline: dict) -> list[pd.DataFrame]:
    """The `ratios` table of each run a baseline was built from (from its entries' `runs`)."""
    entries = pd.DataFrame(baseline["entries"])
    keys = [*RATIO_KEY, "metric"]
    return [entries[keys].assign(value=entries["runs"].map(lambda v, i=i: v[i]))
            for i in range(baseline["n_runs"])]


def best_of(runs: list[dict]) -> pd.DataFrame:
    """The gated ratios, each the best any of `runs` saw (a re-measurement confirms a
    regression only if it was slow every time)."""
    return best_value([ratios(r) for r in runs])


def best_value(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Each ratio's best value over several runs' `ratios` tables."""
    table = pd.concat(tables, ignore_index=True)
    return table.groupby([*RATIO_KEY, "metric"], as_index=False)["value"].max()


@dataclass
class Comparison:
    """The comparison: `table` has a row per compared (case or group, metric), `gated` saying
    whether it can fail the gate; `failed` holds the gated rows beyond their thresholds."""

    table: pd.DataFrame
    missing: list[str]

    @property
    def failed(self) -> pd.DataFrame:
        return self.table[self.table["regressed"]]

    @property
    def ok(self) -> bool:
        return not bool(self.table["regressed"].any())


def gated(level: str, backend: str, metric: str) -> bool:
    """Which comparisons can fail the gate. Speedups over the oracle, per case and per backend.
    The roofline share only for the oracle itself (its per-backend median), where no speedup
    can see it: a machine-wide slowdown (another tenant, a lower clock) moves every backend's
    share at once while the speedups hold, so elsewhere the share is shown, not gated
    (docs/notes/gate.md, 'Regression gate')."""
    if metric == "speedup_best":
        return True
    return level == "group" and backend == oracle_name()


def compare(results: dict | pd.DataFrame, baseline: dict) -> Comparison:
    """Check one run (a results.json dict or table) against a baseline."""
    return compare_ratios(ratios(results), baseline)


def compare_ratios(current: pd.DataFrame, baseline: dict) -> Comparison:
    """Check gated ratios (as `ratios` returns) against a baseline; cases absent from
    `current` are listed in `missing`."""
    keys = [*RATIO_KEY, "metric"]
    base = pd.DataFrame(baseline["entries"])
    merged = base.merge(current, on=keys, how="left")
    missing = [" ".join(str(r[k]) for k in keys)
               for _, r in merged[merged["value"].isna()].iterrows()]
    merged = merged.dropna(subset=["value"]).copy()
    merged["log_dev"] = np.log(merged["value"] / merged["median"])

    cases = merged.assign(level="case", shape=merged.apply(_shape_label, axis=1),
                          noise=merged["spread"])
    groups = _group_medians(merged).merge(
        pd.DataFrame(baseline["groups"]), on=[*GROUP_KEY, "metric"], how="inner")
    groups = groups.assign(
        level="group", head="all", shape=groups["n"].map(lambda n: f"median of {n} cases"),
        noise=groups["spread"])
    cols = ["level", "backend", "head", "shape", "dtype", "pass", "metric", "log_dev",
            "threshold", "noise"]
    out = pd.concat([cases[[*cols, "median", "value"]], groups[cols]], ignore_index=True)
    out["change_pct"] = 100 * np.expm1(out["log_dev"])
    out["gated"] = [gated(level, backend, metric) for level, backend, metric
                    in zip(out["level"], out["backend"], out["metric"], strict=True)]
    out["beyond"] = out["log_dev"] < -out["threshold"]
    out["regressed"] = out["beyond"] & out["gated"] & _confirmed_by_its_share(out)
    return Comparison(out, missing)


def _confirmed_by_its_share(out: pd.DataFrame) -> pd.Series:
    """False for a case's speedup drop whose backend held its share of the physical ceiling at
    that case: the oracle got faster, not the backend slower (a case of A1's forward at B = 256
    halved the speedups of torch, compile and cpp at once in three fresh processes while their
    shares held; docs/notes/gate.md, 'Regression gate'). True elsewhere."""
    case_key = ["backend", "head", "shape", "dtype", "pass"]
    shares = out.loc[(out["level"] == "case") & (out["metric"] == "roofline_best_pct"),
                     [*case_key, "beyond"]].rename(columns={"beyond": "share_beyond"})
    share_beyond = out[case_key].merge(shares, on=case_key, how="left")["share_beyond"]
    case_speedup = (out["level"] == "case") & (out["metric"] == "speedup_best")
    return ~case_speedup | share_beyond.fillna(True).astype(bool).to_numpy()


def _shape_label(row: pd.Series) -> str:
    return f"B={row['batch']} I={row['inputs']} P={row['paths']} O={row['outputs']}"


