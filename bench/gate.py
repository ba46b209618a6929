"""The regression gate: this run's same-run ratios against a committed baseline.

Two ratios per measurement, both higher-is-better and both free of the machine's absolute
speed, both from each measurement's fastest sample (on this shared CPU the fastest sample
wanders far less between runs than the median: bench/NOTES.md, 'Regression gate'):

- `speedup_best`: the einsum oracle's time over the backend's, timed in the same run (not
  gated for einsum itself, where it is 1 by definition);
- `roofline_best_pct`: the roofline floor (the same run's matmul peak and copy bandwidth,
  SPEC §2's FLOP and byte counts) over the backend's time, in percent.

A baseline (`reports/baseline/<machine>.json`) is built from N runs of unchanged code: for every
measurement the median of each ratio over the runs and the largest deviation of a single run
from it, |log(run / median)|. Two checks:

- case: one measurement's ratio fell by more than its own threshold, `margin` × its spread, at
  least `case_floor`;
- group: the median, over a backend's measurements of one pass and dtype, of their log changes
  fell by more than that group's threshold, `margin` × the largest such median seen over the
  baseline runs, at least `group_floor`. A slower backend slows all its cases, which moves the
  median by the full amount; noise in one or two cases (a stall, the oracle's bimodal
  allocation time) does not.

Every comparison is reported; what can fail the gate is `gated`: speedups (case and group) and
the oracle's own roofline share (group). A failure is re-measured `confirm` times and judged on
the best value each ratio reached, so only a slowdown present in every run fails.

From the command line every run, the baseline's and the check's, is a fresh Python process, as
CI's is: some ratios sit at a different level in a fresh process than in later runs of one
process (the cause was not isolated), and a baseline measured in one process had set
thresholds that fresh processes of unchanged code crossed (bench/NOTES.md, 'Regression gate').

On a CPU the gate times with one thread (`CPU_THREADS`). With one thread per core, any other
process on the machine stalls one thread of every parallel region and the whole call waits for
it, differently for each backend; with one thread the other core absorbs it. Measured: the
largest spread of a backend's median speedup fell from ±29% to ±13% over fresh-process runs.
The price: the gate does not see a regression in parallel scaling (the full suite, run with
all cores, reports that, and the dashboard shows it).
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.history import slug, write_atomic
from bench.planted import from_spec

ROOT = Path(__file__).resolve().parent.parent
BASELINE_DIR = ROOT / "reports" / "baseline"
BASELINE_SCHEMA = 1
METRICS: tuple[str, ...] = ("speedup_best", "roofline_best_pct")
CASE_KEY: tuple[str, ...] = ("backend", "head", "batch", "inputs", "paths", "outputs", "dtype",
                             "pass")
GROUP_KEY: tuple[str, ...] = ("backend", "dtype", "pass")
# torch CPU threads the gate times with (module docstring)
CPU_THREADS = 1


def ratios(results: dict | pd.DataFrame) -> pd.DataFrame:
    """Long table (CASE_KEY..., metric, value) of one run's gated ratios.

    `results` is a results.json dict or the results table. Only measurements that ran and
    matched the oracle count; einsum's speedup (1 by definition) is left out.
    """
    df = pd.DataFrame(results["rows"]) if isinstance(results, dict) else results
    df = df[(df["status"] == "ok") & (df["correct"] == True)].copy()  # noqa: E712
    df = df.drop_duplicates(list(CASE_KEY))
    # floor / min_s, from the columns every results row has
    df["roofline_best_pct"] = (df["roofline_pct"].astype(float) * df["median_s"].astype(float)
                               / df["min_s"].astype(float))
    long = df.melt(id_vars=list(CASE_KEY), value_vars=list(METRICS), var_name="metric")
    long = long[~((long["backend"] == "einsum") & (long["metric"] == "speedup_best"))]
    long["value"] = long["value"].astype(float)
    long = long[np.isfinite(long["value"]) & (long["value"] > 0)]
    return long.astype({"batch": int, "inputs": int, "paths": int,
                        "outputs": int}).reset_index(drop=True)


def _group_medians(dev: pd.DataFrame) -> pd.DataFrame:
    """Median log-deviation and case count per (run, group, metric) of a `log_dev` table."""
    keys = [k for k in ("run", *GROUP_KEY, "metric") if k in dev]
    return dev.groupby(keys, as_index=False).agg(log_dev=("log_dev", "median"),
                                                 n=("log_dev", "size"))


def machine_kind(provenance: dict) -> str:
    """What a baseline is kept per: the machine label, and on CPUs the CPU's family and model
    (ratios between backends move with the instruction set and the caches)."""
    kind = provenance["machine"]
    if provenance.get("device", "cpu") == "cpu":
        kind += f"-{provenance.get('cpu_id', 'unknown-cpu')}"
    return slug(kind)


def build_baseline(runs: list[dict], *, margin: float = 1.5, case_floor: float = 0.10,
                   group_floor: float = 0.05, note: str = "") -> dict:
    """A baseline (JSON-ready) from N results.json dicts of unchanged code on one machine."""
    if len(runs) < 3:
        raise ValueError(f"runs: a baseline needs at least 3 runs to measure their spread, "
                         f"got {len(runs)}")
    machines = {machine_kind(r["provenance"]) for r in runs}
    if len(machines) != 1:
        raise ValueError(f"runs: all runs must come from one machine kind, got {machines}")
    threads = {r["provenance"].get("threads") for r in runs}
    if len(threads) != 1:
        raise ValueError(f"runs: all runs must use one thread count, got {threads}")
    prov = runs[-1]["provenance"]
    return {
        "kind": "glai-kernels-gate-baseline", "schema": BASELINE_SCHEMA,
        "machine": machine_kind(prov), "device_name": prov.get("device_name", ""),
        "cpu_id": prov.get("cpu_id", ""), "threads": prov.get("threads"),
        "preset": runs[-1].get("preset", {}).get("name", "custom"),
        "commits": sorted({r["provenance"].get("commit", "unknown") for r in runs}),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_averages": [r["provenance"].get("load_average") for r in runs],
        "n_runs": len(runs), "margin": margin, "case_floor": case_floor,
        "group_floor": group_floor, "note": note,
        **thresholds_from([ratios(r) for r in runs], margin=margin, case_floor=case_floor,
                          group_floor=group_floor),
    }


def thresholds_from(tables: list[pd.DataFrame], *, margin: float, case_floor: float,
                    group_floor: float) -> dict:
    """The baseline's statistics from N runs' `ratios` tables: {"spread", "groups",
    "entries"} (each entry keeps every run's value, so `run_tables` can recover the runs)."""
    table = pd.concat([t.assign(run=i) for i, t in enumerate(tables)], ignore_index=True)
    keys = [*CASE_KEY, "metric"]
    # only what every run measured: a case some runs skipped has no spread to judge it by
    counts = table.groupby(keys)["run"].transform("nunique")
    table = table[counts == len(tables)].copy()
    median = table.groupby(keys)["value"].transform("median")
    table["log_dev"] = np.log(table["value"] / median)
    groups = _group_medians(table)

    spreads = {}
    for metric in METRICS:
        case_dev = (table[table["metric"] == metric].groupby(list(CASE_KEY))["log_dev"]
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
    keys = [*CASE_KEY, "metric"]
    return [entries[keys].assign(value=entries["runs"].map(lambda v, i=i: v[i]))
            for i in range(baseline["n_runs"])]


def baseline_path(machine: str, baseline_dir: Path = BASELINE_DIR) -> Path:
    return baseline_dir / f"{slug(machine)}.json"


def write_baseline(baseline: dict, baseline_dir: Path = BASELINE_DIR) -> Path:
    path = baseline_path(baseline["machine"], baseline_dir)
    write_atomic(path, json.dumps(baseline, indent=1) + "\n")
    return path


def load_baseline(machine: str, baseline_dir: Path = BASELINE_DIR) -> dict | None:
    """The committed baseline for this kind of machine, None when there is none."""
    path = baseline_path(machine, baseline_dir)
    if not path.exists():
        return None
    baseline = json.loads(path.read_text())
    if baseline.get("schema", 1) > BASELINE_SCHEMA:
        raise ValueError(f"{path}: baseline schema {baseline['schema']} is newer than this "
                         f"code's {BASELINE_SCHEMA}")
    return baseline


@dataclass
class Verdict:
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
    (bench/NOTES.md, 'Regression gate')."""
    if metric == "speedup_best":
        return True
    return level == "group" and backend == "einsum"


def compare(results: dict | pd.DataFrame, baseline: dict) -> Verdict:
    """Check one run (a results.json dict or table) against a baseline."""
    return compare_ratios(ratios(results), baseline)


def compare_ratios(current: pd.DataFrame, baseline: dict) -> Verdict:
    """Check gated ratios (as `ratios` returns) against a baseline; cases absent from
    `current` are listed in `missing`."""
    keys = [*CASE_KEY, "metric"]
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
    out["regressed"] = out["beyond"] & out["gated"]
    return Verdict(out, missing)


def _shape_label(row: pd.Series) -> str:
    return f"B={row['batch']} I={row['inputs']} P={row['paths']} O={row['outputs']}"


def _pct(log: float) -> str:
    return f"{100 * math.expm1(log):+.1f}%"


def _drop(threshold: float) -> str:
    """A log-scale threshold as the fall in the ratio it allows, e.g. "-13.9%"."""
    return f"-{100 * -math.expm1(-threshold):.1f}%"


def report(verdict: Verdict, baseline: dict, *, limit: int = 40) -> str:
    """A Markdown table of what regressed (or a one-line all-clear), with the noise beside it."""
    n_case = int((verdict.table["level"] == "case").sum())
    head = (f"regression gate against reports/baseline/{slug(baseline['machine'])}.json "
            f"({baseline['n_runs']} baseline runs; thresholds {baseline['margin']}× the largest "
            f"spread seen, at least {100 * baseline['case_floor']:.0f}% per case and "
            f"{100 * baseline['group_floor']:.0f}% per backend)")
    lines = [head]
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
                     f"{w['shape']} {w['pass']} {w['metric']}, threshold {_drop(w['threshold'])})")
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
    lines += ["", "If the slowdown is intended, accept a new baseline on purpose: "
              "`nox -s gate -- accept` (see bench/NOTES.md, 'Regression gate')."]
    return "\n".join(lines)


# ---------------------------------------------------------------- measuring and the command line

def measure(preset="quick", *, device: str | None = None, log=print,
            threads: int | None = None, **options) -> dict:
    """One run of `preset` (a name or a `bench.sweeps.Preset`; kernel suite, no plots) as the
    results.json dict it would write; on a CPU with `threads` (default `CPU_THREADS`);
    `options` go to `bench.suite.run` (e.g. backends)."""
    import torch

    from bench import suite
    from bench.provenance import ROW_FIELDS

    if threads is None and suite.resolve_device(device).type == "cpu":
        threads = CPU_THREADS
    name = getattr(preset, "name", preset)
    previous = torch.get_num_threads()
    try:
        out = suite.run(preset, device=device, plots=False, progress=False, log=log,
                        threads=threads, command=f"python -m bench.gate (preset {name})",
                        **options)
    finally:
        torch.set_num_threads(previous)  # the caller's threads, e.g. the rest of a test session
    rows = json.loads(out.table.drop(columns=list(ROW_FIELDS))
                      .to_json(orient="records"))
    return {**out.meta, "rows": rows}


def measure_fresh(preset: str = "quick", *, device: str | None = None,
                  plant: str | None = None) -> dict:
    """One run of `preset` in a fresh Python process (`python -m bench.gate measure`), as CI
    runs it; `plant` ("BACKEND=FACTOR") slows a backend down in that process."""
    with tempfile.TemporaryDirectory(prefix="glai-gate-") as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, "-m", "bench.gate", "measure", "--out", str(out),
                   "--preset", preset]
        if device:
            command += ["--device", device]
        if plant:
            command += ["--plant", plant]
        subprocess.run(command, check=True, cwd=ROOT)
        return json.loads(out.read_text())


def save_run(path: Path, result: dict) -> None:
    """One run's results.json dict, written atomically."""
    write_atomic(path, json.dumps(result, default=str) + "\n")


def best_of(runs: list[dict]) -> pd.DataFrame:
    """The gated ratios, each the best any of `runs` saw (a re-measurement confirms a
    regression only if it was slow every time)."""
    return best_value([ratios(r) for r in runs])


def best_value(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Each ratio's best value over several runs' `ratios` tables."""
    table = pd.concat(tables, ignore_index=True)
    return table.groupby([*CASE_KEY, "metric"], as_index=False)["value"].max()


def check(results: dict | None = None, *, baseline_dir: Path = BASELINE_DIR,
          confirm: int = 2, preset="quick", device: str | None = None,
          save_dir: Path | None = None, log=print, fresh: bool = False,
          plant: str | None = None, **options) -> tuple[bool, str]:
    """Measure (unless `results` is given) and compare; on a failure measure up to `confirm`
    more times and judge the best of all runs. `fresh` runs each measurement in its own
    process (`plant` then slows a backend there); otherwise here, with `options` going to
    `bench.suite.run`. Returns (passed, report)."""
    def measure_once() -> dict:
        if fresh:
            return measure_fresh(getattr(preset, "name", preset), device=device, plant=plant)
        with from_spec(plant):
            return measure(preset, device=device, log=log, **options)

    def run() -> dict:
        result = measure_once()
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            path = save_dir / f"gate-run-{len(list(save_dir.glob('gate-run-*.json'))) + 1}.json"
            save_run(path, result)
        return result

    runs = [results if results is not None else run()]
    machine = machine_kind(runs[0]["provenance"])
    baseline = load_baseline(machine, baseline_dir)
    if baseline is None:
        return True, (f"regression gate: no baseline for machine kind {machine!r} in "
                      f"{baseline_dir}; nothing to compare. Make one with "
                      f"`nox -s gate -- accept` and commit it.")
    threads = (baseline.get("threads"), runs[0]["provenance"].get("threads"))
    if None not in threads and threads[0] != threads[1]:
        return False, (f"regression gate: the baseline was timed with {threads[0]} CPU "
                       f"threads, this run with {threads[1]}; ratios at different thread "
                       f"counts are not comparable. Accept a new baseline with this code.")
    verdict = compare(runs[0], baseline)
    for attempt in range(confirm if results is None else 0):
        if verdict.ok:
            break
        log(report(verdict, baseline))
        log(f"re-measuring to confirm ({attempt + 1} of {confirm}): a regression must "
            f"show in every run")
        runs.append(run())
        verdict = compare_ratios(best_of(runs), baseline)
    return verdict.ok, report(verdict, baseline)


def accept(runs: list[dict], *, baseline_dir: Path = BASELINE_DIR,
           **options) -> tuple[Path, dict]:
    """Build a baseline from `runs` (options: see `build_baseline`) and write it."""
    baseline = build_baseline(runs, **options)
    return write_baseline(baseline, baseline_dir), baseline


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


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="measure the quick preset and compare with the baseline")
    c.add_argument("--results", type=Path, help="compare this results.json instead of measuring")
    c.add_argument("--confirm", type=int, default=2,
                   help="re-measurements before a failure stands (default 2)")
    c.add_argument("--save", type=Path, metavar="DIR",
                   help="keep each measured run's results as DIR/gate-run-N.json")
    a = sub.add_parser("accept", help="write a new baseline for this machine kind, on purpose")
    a.add_argument("--runs", type=int, default=10,
                   help="runs of unchanged code, each in a fresh process (default 10)")
    a.add_argument("--results", type=Path, nargs="+",
                   help="build it from these results.json files instead of measuring")
    a.add_argument("--note", default="", help="why the baseline changed (kept in the file)")
    a.add_argument("--margin", type=float, default=1.5)
    a.add_argument("--case-floor", type=float, default=0.10)
    a.add_argument("--group-floor", type=float, default=0.05)
    m = sub.add_parser("measure", help="one run in this process, written to --out (what "
                                       "check and accept start in a fresh process per run)")
    m.add_argument("--out", type=Path, required=True)
    for sp in (c, m):
        sp.add_argument("--plant", metavar="BACKEND=FACTOR",
                        help="slow BACKEND down FACTOR times (e.g. torch=1.25) to see the "
                             "gate fail")
    for sp in (c, a, m):
        sp.add_argument("--preset", default="quick")
        sp.add_argument("--device", choices=("cpu", "cuda"), default=None)
    for sp in (c, a):
        sp.add_argument("--baseline-dir", type=Path, default=BASELINE_DIR)
    args = p.parse_args(argv)

    if args.command == "measure":
        if args.plant:
            print(f"planted: backend slowed, {args.plant}")
        with from_spec(args.plant):
            result = measure(args.preset, device=args.device)
        save_run(args.out, result)
        return 0
    if args.command == "check":
        results = json.loads(args.results.read_text()) if args.results else None
        passed, text = check(results, baseline_dir=args.baseline_dir, confirm=args.confirm,
                             preset=args.preset, device=args.device, save_dir=args.save,
                             fresh=True, plant=args.plant)
        print(text)
        return 0 if passed else 1
    if args.results:
        runs = [json.loads(f.read_text()) for f in args.results]
    else:
        runs = []
        for i in range(args.runs):
            print(f"baseline run {i + 1} of {args.runs}, in a fresh process")
            runs.append(measure_fresh(args.preset, device=args.device))
    path, baseline = accept(runs, baseline_dir=args.baseline_dir, note=args.note,
                            margin=args.margin, case_floor=args.case_floor,
                            group_floor=args.group_floor)
    print(spread_summary(baseline))
    print(f"wrote {path}; commit it with a message saying why the baseline moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
