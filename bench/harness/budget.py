"""A run's time limit kept by the run itself, its closing work included (a short GPU lease
cuts a step off with `timeout`; a run cut off that way loses whatever it had not written).

    budget = Budget(time.monotonic() + 60, 60)   # the limit counts from here
    budget.closing_s = ceilings_s + reports_s
    note = budget.refuses(estimate_s)      # None: there is time to start it

`refuses` says why a piece of work (a shape, one backend's measurement) is not started: the
time left is less than its estimate plus the reserve for the closing ceilings and reports.
Estimates are the larger of a bound from the timing parameters (`lower_bound_s`: what the
timers and energy windows spend at least) and the seconds per unit of `case_cost` observed
so far in this run (`observe`), so the first shape is not started blind and a slow machine
is learned from its first shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.harness.energy import UPDATE_WAIT_S

# the CUDA timer's fewest seconds (`timing.time_cuda`: do_bench's 25 ms warm-up and at
# least 25 ms of repetitions) and the CPU warm-up's (`timing.warm`)
CUDA_TIMING_MIN_S = 0.05
CPU_WARM_S = 0.05
# the reports' reserve: a fixed part, a part per result row and the plots (measured: 0.9 s for
# 6 rows with plots on this project's 2-core CPU, 3.9 s for 288 rows with plots and 0.5 s for
# 144 without on an H200's host; the reserve is about twice that)
REPORTS_BASE_S = 2.0
REPORTS_PER_ROW_S = 0.01
PLOTS_S = 4.0


def lower_bound_s(device_type: str, min_time_s: float, rounds: int,
                  energy_window_s: float = 0.0) -> float:
    """The fewest seconds one backend's measurement of one pass takes: its warm-up and timed
    calls (`bench.harness.timing`) and, with the energy meter on, one window of at least
    `energy_window_s` that waits for the counter at its start (up to UPDATE_WAIT_S)."""
    from bench.harness.timing import MIN_BLOCK_S

    if device_type == "cuda":
        timed = max(CUDA_TIMING_MIN_S, min_time_s + 0.025)
    else:
        timed = CPU_WARM_S + max(min_time_s, rounds * MIN_BLOCK_S)
    energy = energy_window_s + UPDATE_WAIT_S / 2 if energy_window_s > 0 else 0.0
    return timed + energy


def reports_s(rows: int, plots: bool) -> float:
    """The reserve for writing a run's reports of `rows` rows (module constants)."""
    return REPORTS_BASE_S + REPORTS_PER_ROW_S * rows + (PLOTS_S if plots else 0.0)


TIME_LIMIT_NOTE = "not measured: the run's time limit was reached"


def past(deadline: float | None) -> bool:
    """Whether a run's `deadline` (time.monotonic(), or None: none) has passed."""
    return deadline is not None and time.monotonic() > deadline


def why_not(ctx, estimate_s: float) -> str | None:
    """Why work of `estimate_s` seconds is not started in the run of `ctx` (the runner's
    Context: a stop signal, its `deadline`, its `budget`), as a skipped row's note; None
    when it may start."""
    if ctx.stopped is not None:
        return f"not measured: the run was stopped by {ctx.stopped}"
    if past(ctx.deadline):
        return TIME_LIMIT_NOTE
    return None if ctx.budget is None else ctx.budget.refuses(estimate_s)


@dataclass
class Budget:
    """The time left to a run with a limit. `end` is time.monotonic() by which the run must
    have ended, reports written; `closing_s` the seconds kept back for its closing work."""

    end: float
    limit_s: float
    closing_s: float = 0.0
    spent_s: float = 0.0  # seconds of work observed
    spent_cost: float = 0.0  # its units of cost

    def left_s(self) -> float:
        """Seconds until the end (negative past it)."""
        return self.end - time.monotonic()

    def observe(self, seconds: float, cost: float) -> None:
        """A piece of work of `cost` units took `seconds`: later estimates scale with it."""
        if cost > 0:
            self.spent_s, self.spent_cost = self.spent_s + seconds, self.spent_cost + cost

    def estimate_s(self, cost: float, bound_s: float) -> float:
        """The seconds work of `cost` units is expected to take: the rate seen so far, and at
        least `bound_s`."""
        seen = self.spent_s / self.spent_cost * cost if self.spent_cost > 0 else 0.0
        return max(bound_s, seen)

    def refuses(self, estimate_s: float) -> str | None:
        """None when work of `estimate_s` seconds fits before the closing reserve; else the
        skipped row's note saying why not."""
        left = self.left_s()
        if left - self.closing_s >= estimate_s:
            return None
        return (f"not measured: the run's time limit of {self.limit_s:g} s left "
                f"{max(left, 0):.0f} s, less than the {estimate_s:.2g} s estimated for it "
                f"plus {self.closing_s:.0f} s for the closing ceilings and reports")
