"""The regression gate: this run's same-run ratios against a committed baseline.

Two ratios per measurement, both higher-is-better and both free of the machine's absolute
speed, both from each measurement's fastest sample (on this shared CPU the fastest sample
wanders far less between runs than the median: docs/notes/gate.md, 'Regression gate'):

- `speedup_best`: the oracle's time (the registry's baseline backend, einsum for the dense
  op) over the backend's, timed in the same run (not gated for the oracle itself, where it is
  1 by definition);
- `roofline_best_pct`: the roofline floor (the same run's physical ceilings: the native FMA
  peak and the triad/copy bandwidth, bench/harness/ceilings.py; docs/ARCHITECTURE.md §2's
  minimum FLOP and byte counts) over the backend's time, in percent.

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
thresholds that fresh processes of unchanged code crossed (docs/notes/gate.md, 'Regression gate').

On a CPU the gate times with one thread (`CPU_THREADS`). With one thread per core, any other
process on the machine stalls one thread of every parallel region and the whole call waits for
it, differently for each backend; with one thread the other core absorbs it. Measured: the
largest spread of a backend's median speedup fell from ±29% to ±13% over fresh-process runs.
The price: the gate does not see a regression in parallel scaling (the full suite, run with
all cores, reports that, and the dashboard shows it).

The package, by job:

- `stats`: one run's ratios, a baseline's spreads and thresholds, the comparison;
- `store`: building, writing and reading the baseline files;
- `reporting`: the Markdown report and a new baseline's spread summary;
- `measuring`: a run here or in a fresh process, and `check`'s re-measure policy;
- `paired`: this checkout against a base commit, both measured here, interleaved, with
  thresholds from those runs' own spread (`versus`; what `check` runs first, so a machine
  kind with no committed baseline is still compared);
- `cli`: `python -m bench.gate check|accept|measure` (also `glai-bench gate ...`);
- `planted`: a deliberately slowed backend (`--plant`), which proves the gate catches a
  slowdown (here, not in the harness: only the gate and its tests plant one);
- `holdout`: the gate's false-alarm and miss rates, replayed from a baseline's runs
  (`glai-bench holdout`; here, not with the CI tools: it judges the gate's statistics).
"""

from bench.gate.measuring import CPU_THREADS, check, measure, measure_fresh, save_run
from bench.gate.paired import versus
from bench.gate.reporting import report, spread_summary
from bench.gate.stats import (
    GROUP_KEY,
    METRICS,
    RATIO_KEY,
    Comparison,
    best_of,
    best_value,
    compare,
    compare_ratios,
    gated,
    oracle_name,
    ratios,
    run_tables,
    thresholds_from,
)
from bench.gate.store import (
    BASELINE_DIR,
    BASELINE_SCHEMA,
    accept,
    baseline_path,
    build_baseline,
    load_baseline,
    machine_kind,
    write_baseline,
)

__all__ = [
    "BASELINE_DIR", "BASELINE_SCHEMA", "CPU_THREADS", "GROUP_KEY", "METRICS", "RATIO_KEY",
    "Comparison", "accept", "baseline_path", "best_of", "best_value", "build_baseline", "check",
    "compare", "compare_ratios", "gated", "load_baseline", "machine_kind", "measure",
    "measure_fresh", "oracle_name", "ratios", "report", "run_tables", "save_run",
    "spread_summary", "thresholds_from", "versus", "write_baseline",
]
