"""The gate without a committed baseline: this checkout (the candidate) against a base commit,
both measured on this machine in this session.

    passed, text = versus(base="HEAD~1", pairs=2)

The base is checked out with `git worktree add --detach` into a temporary folder and timed
from there (PYTHONPATH pointing at it; its C++ extension builds just in time, and the JIT cache
keys on the sources, so an unchanged csrc reuses this checkout's build). Runs alternate in
fresh processes, base, candidate, base, candidate..., so a slow minute of the shared machine
falls on both sides alike; with `jobs=2` (the default) each pair's two processes run side by
side, one per core (each times with one thread), which halves the wall time: a run of the
quick preset's cases costs about 50 s of CPU, most of it the correctness checks and warm-up
calls, not the timing. Each run yields the same-run ratios of `bench.gate.stats.ratios`.

The rule (docs/notes/gate.md, "Current state"). Per ratio (backend, shape, pass, metric), each
side's value is the geometric mean of its runs and the change is log(candidate / base). The
run-to-run spread s of a ratio is the pooled standard deviation of its log values about their
own side's mean, over both sides (2·n − 2 degrees of freedom for n pairs); a group's (backend,
dtype, pass) spread is the same statistic of the per-run median, over the group's cases, of
those deviations. A drop counts when it exceeds both a floor and k × s:

- case: change < −max(`CASE_FLOOR`, k × s of that ratio);
- group: the median of its cases' changes < −max(`GROUP_FLOOR`, k × s of the group).

What can fail is what the committed-baseline check gates (`stats.gated`: speedups per case
and per backend, the oracle's roofline share per backend; a case's speedup drop only when
that backend's share there fell too). On a failure (of this rule or of the further check
`versus` is given, the committed baseline's) one more pair is measured, up to `confirm`
times, and the verdict is taken again over all pairs, so a one-off stall is diluted while a
real slowdown, present in every candidate run, stays.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from bench.gate.reporting import report
from bench.gate.stats import GROUP_KEY, METRICS, RATIO_KEY, Comparison, compare_ratios, ratios
from bench.gate.store import ROOT, machine_kind

# k: how many pooled run-to-run spreads a drop must exceed
SPREAD_FACTOR = 3.0
# and the least drop that counts, per case and per backend group (logs of the ratio)
CASE_FLOOR = 0.10
GROUP_FLOOR = 0.05
# the CI-sized timing: the quick preset's cases, shorter per measurement (a fresh-process run
# of the quick preset as it stands takes about 110 s at one thread; the gate runs several)
CI_TIMING = {"min_time_s": 0.05, "rounds": 3, "ceiling_time_s": 0.05}

# Runs in each tree's own Python (PYTHONPATH = that tree): one measurement of the quick
# preset's cases with the given timing, written to a results.json. It uses only what the gate
# has had since before this module (`measure`, `save_run`, `planted.from_spec`), so a base
# commit from before it measures the same way.
_WORKER = """
import dataclasses, json, sys
from pathlib import Path
args = json.loads(sys.argv[1])
try:
    from bench.harness import onednn_guard
    onednn_guard.apply()
except ImportError:
    pass
from bench.gate.measuring import measure, save_run
from bench.gate.planted import from_spec
from bench.harness.sweeps import PRESETS
preset = dataclasses.replace(PRESETS[args["preset"]], **args["timing"])
with from_spec(args["plant"]):
    result = measure(preset, device=args["device"], log=lambda *a, **k: None)
save_run(Path(args["out"]), result)
"""


def git(*args: str, cwd: Path = ROOT) -> str:
    """`git args...` in `cwd`, its stdout stripped; ValueError with git's message on failure."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def base_revision(root: Path = ROOT, main: str = "main") -> str:
    """The default base: the merge base with `main`, or `HEAD~1` where that is HEAD itself (on
    main, in CI) or there is no `main`; as a full commit id."""
    head = git("rev-parse", "HEAD", cwd=root)
    try:
        base = git("merge-base", "HEAD", main, cwd=root)
    except ValueError:
        base = head
    return git("rev-parse", "--verify", "HEAD~1^{commit}", cwd=root) if base == head else base


@contextmanager
def checkout(rev: str, root: Path = ROOT) -> Iterator[Path]:
    """A detached worktree of `rev` in a temporary folder, removed afterwards."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=root)
    tmp = Path(tempfile.mkdtemp(prefix="glai-gate-base-"))
    tree = tmp / "base"
    git("worktree", "add", "--detach", str(tree), commit, cwd=root)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def measure_in(tree: Path, *, preset: str = "quick", device: str | None = None,
               plant: str | None = None, timing: dict | None = None) -> dict:
    """One run of `preset`'s cases (`timing` overrides its per-measurement times) in a fresh
    process whose code is `tree`'s; `plant` ("BACKEND=FACTOR") slows a backend there."""
    with tempfile.TemporaryDirectory(prefix="glai-gate-") as tmp:
        out = Path(tmp) / "results.json"
        args = {"out": str(out), "preset": preset, "device": device, "plant": plant,
                "timing": CI_TIMING if timing is None else timing}
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(args)], cwd=tree,
                              env=env, capture_output=True, text=True)
        if done.returncode:
            raise ValueError(f"measuring in {tree} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _deviations(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Log values of one side's runs, with each ratio's mean log and each run's deviation."""
    table = pd.concat([t.assign(run=i) for i, t in enumerate(tables)], ignore_index=True)
    table["log"] = np.log(table["value"])
    table["mean"] = table.groupby([*RATIO_KEY, "metric"])["log"].transform("mean")
    table["dev"] = table["log"] - table["mean"]
    return table


def _pooled_sd(dev: pd.DataFrame, keys: list[str], dof: int) -> pd.Series:
    """Per `keys`, sqrt(sum of squared `dev` / dof): each side's deviations are about its own
    mean, so a real difference between the sides is not counted as noise."""
    return np.sqrt((dev["dev"] ** 2).groupby([dev[k] for k in keys]).sum() / dof)


def paired_baseline(base: list[pd.DataFrame], candidate: list[pd.DataFrame], *,
                    k: float = SPREAD_FACTOR, case_floor: float = CASE_FLOOR,
                    group_floor: float = GROUP_FLOOR) -> tuple[dict, pd.DataFrame]:
    """The base's side as a baseline `compare_ratios` reads (entries: geometric mean and
    threshold per ratio; groups: threshold per backend, dtype, pass and metric, both from the
    pooled spread of both sides), and the candidate's geometric means as its `ratios` table.
    Only ratios every run of both sides measured are judged."""
    n = min(len(base), len(candidate))
    if n < 2:
        raise ValueError(f"pairs: a spread needs at least 2 runs per side, got {n}")
    keys = [*RATIO_KEY, "metric"]
    sides = {"base": _deviations(base), "candidate": _deviations(candidate)}
    both = pd.concat([d.assign(side=s) for s, d in sides.items()], ignore_index=True)
    runs = len(base) + len(candidate)
    complete = both.groupby(keys)["run"].transform("size") == runs
    # measured by the base but by no candidate run: a backend that failed its correctness
    # check or was skipped; named in the report (a wrong kernel is never fast or slow)
    base_only = both[~complete].groupby(keys)["side"].agg(lambda s: set(s) == {"base"})
    lost = [" ".join(str(v) for v in key) for key, only in base_only.items() if only]
    both = both[complete]
    dof = runs - 2
    case_sd = _pooled_sd(both, keys, dof).rename("spread").reset_index()
    per_run = ["side", "run", *GROUP_KEY, "metric"]
    run_medians = both.groupby(per_run, as_index=False)["dev"].median()
    group_sd = _pooled_sd(run_medians, [*GROUP_KEY, "metric"], dof).rename("spread").reset_index()
    cases = both.groupby(per_run).size().groupby(
        [*GROUP_KEY, "metric"]).max().rename("cases").reset_index()

    means = both.groupby(["side", *keys], as_index=False)["log"].mean()
    entries = means[means["side"] == "base"].drop(columns="side").merge(case_sd, on=keys)
    entries["median"] = np.exp(entries.pop("log"))
    entries["threshold"] = np.maximum(case_floor, k * entries["spread"])
    groups = group_sd.merge(cases, on=[*GROUP_KEY, "metric"])
    groups["threshold"] = np.maximum(group_floor, k * groups["spread"])
    current = means[means["side"] == "candidate"].drop(columns="side")
    current = current.assign(value=np.exp(current.pop("log")))
    spread = {m: {"case_median": float(case_sd.loc[case_sd["metric"] == m, "spread"].median()),
                  "group_median": float(group_sd.loc[group_sd["metric"] == m, "spread"].median())}
              for m in METRICS}
    baseline = {"machine": "", "n_runs": len(base), "margin": k, "case_floor": case_floor,
                "group_floor": group_floor, "spread": spread,
                "entries": entries.to_dict(orient="records"),
                "groups": groups.to_dict(orient="records"), "lost": lost}
    return baseline, current


def judge(base_runs: list[dict], candidate_runs: list[dict], **rule) -> tuple[Comparison, dict]:
    """The comparison of the candidate's runs with the base's (results.json dicts), and the
    baseline-like dict its thresholds came from (see `paired_baseline`)."""
    machines = {machine_kind(r["provenance"]) for r in [*base_runs, *candidate_runs]}
    if len(machines) != 1:
        raise ValueError(f"runs: the base and candidate ran on different machines: {machines}")
    baseline, current = paired_baseline([ratios(r) for r in base_runs],
                                        [ratios(r) for r in candidate_runs], **rule)
    baseline["machine"] = machines.pop()
    verdict = compare_ratios(current, baseline)
    verdict.missing = baseline["lost"]
    return verdict, baseline


def paired_report(verdict: Comparison, baseline: dict, base: str) -> str:
    """`report`'s table, headed by what was compared and the rule."""
    title = (f"regression gate: this checkout against {base}, {baseline['n_runs']} interleaved "
             f"fresh-process runs each on {baseline['machine']}; a drop counts beyond "
             f"{baseline['margin']:g}× the pooled run-to-run spread and at least "
             f"{100 * baseline['case_floor']:.0f}% per case, "
             f"{100 * baseline['group_floor']:.0f}% per backend")
    return report(verdict, baseline, title=title,
                  advice="If the slowdown is intended, say so in the change's notes; the gate "
                         "compares with the base commit, so the next change is judged from it.")


def versus(base: str | None = None, *, pairs: int = 2, confirm: int = 1, jobs: int = 2,
           preset: str = "quick", device: str | None = None, plant: str | None = None,
           timing: dict | None = None, root: Path = ROOT, log=print,
           also: Callable[[list[dict]], tuple[bool, str]] | None = None,
           **rule) -> tuple[bool, str, list[dict]]:
    """Measure `pairs` interleaved (base, candidate) runs, judge, and on a failure add a pair
    and judge again, up to `confirm` times. `plant` slows a backend in the candidate only;
    `jobs` 2 runs a pair's two processes side by side, 1 one after the other. `also`, a further
    check of the candidate's runs (the committed baseline's), returns (passed, report); its
    failure earns the confirming pair too, and its report follows the paired one.
    Returns (passed, report, the candidate's runs)."""
    if jobs not in (1, 2):
        raise ValueError(f"jobs: 1 (one after the other) or 2 (side by side), got {jobs}")
    if pairs < 2:
        raise ValueError(f"pairs: a spread needs at least 2 pairs, got {pairs}")
    rev = base or base_revision(root)
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=root)
    label = f"{rev} ({commit[:10]})" if rev != commit else commit[:10]
    base_runs: list[dict] = []
    candidate_runs: list[dict] = []
    with checkout(commit, root) as tree:
        def one_pair() -> None:
            log(f"pair {len(base_runs) + 1}: base {label} and the candidate (this checkout"
                f"{', planted ' + plant if plant else ''}), each in a fresh process")
            sides = [partial(measure_in, tree, preset=preset, device=device, timing=timing),
                     partial(measure_in, root, preset=preset, device=device, plant=plant,
                             timing=timing)]
            with ThreadPoolExecutor(jobs) as pool:
                base_run, candidate_run = pool.map(lambda measure: measure(), sides)
            base_runs.append(base_run)
            candidate_runs.append(candidate_run)

        def verdicts() -> tuple[bool, str]:
            verdict, baseline = judge(base_runs, candidate_runs, **rule)
            if verdict.table.empty:
                raise ValueError("nothing was compared: no ratio was measured in every run")
            passed, text = verdict.ok, paired_report(verdict, baseline, label)
            if also is not None:
                also_passed, also_text = also(candidate_runs)
                passed, text = passed and also_passed, f"{text}\n\n{also_text}"
            return passed, text

        for _ in range(pairs):
            one_pair()
        passed, text = verdicts()
        for attempt in range(confirm):
            if passed:
                break
            log(text)
            log(f"re-measuring to confirm ({attempt + 1} of {confirm}): one more pair, judged "
                f"with the others")
            one_pair()
            passed, text = verdicts()
    return passed, text, candidate_runs
