"""How a kernel-suite run stops and what it leaves (bench/harness/suite.py's `run`): a stop
signal turned into a clean close (`stop_on_signals`, `Stopped`), what the close leaves out
when time is short (`closing_notes`), and the rows written as the shapes end (`RowsWriter`),
so a run killed mid-way keeps what it measured."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness import budget as budget_mod
from bench.harness import results
from bench.harness.ceilings import Ceilings
from bench.harness.runner import Context

__all__ = ["RowsWriter", "Stopped", "closing_notes", "stop_on_signals"]


class Stopped(SystemExit):
    """Raised by `run` after it wrote its reports, when a signal asked it to stop: the
    process exits with 128 + the signal's number, as if the signal had ended it."""


class _StopFlag:
    """What `stop_on_signals` found: the signal's name, and the run's Context to tell."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context | None:
        return self._ctx

    @ctx.setter
    def ctx(self, ctx: Context) -> None:
        self._ctx = ctx
        ctx.stopped = self.name


@contextmanager
def stop_on_signals(log: Callable[[str], None]) -> Iterator[_StopFlag]:
    """SIGTERM (a lease's `timeout`) and SIGINT (Ctrl-C) inside: the first asks the run to stop
    (nothing more is started; the measurement under way ends, then the reports are written
    with the rest as skipped), a second ends it at once. Outside the main thread, where
    Python takes no signal handler, nothing changes."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame) -> None:
        if flag.name is not None:  # a second signal: at once
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        flag.name = signal.Signals(signum).name
        if flag.ctx is not None:
            flag.ctx.stopped = flag.name
        log(f"{flag.name}: stopping after the measurement under way; the reports follow "
            "(a second signal ends the run at once)")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def closing_notes(ctx: Context, ceilings_s: float, rows: int, plots: bool) -> dict[str, str]:
    """What the run's close leaves out, and why: {"ceilings": why} when the closing ceilings
    (`ceilings_s`, what the opening ones took) and the reports do not fit the time left or a
    signal stopped the run; {"plots": why} when the plots do not fit either."""
    notes = {}
    if ctx.stopped is not None:
        why = f"the run was stopped by {ctx.stopped}"
        return {"ceilings": why, "plots": why, "stopped_by": ctx.stopped}
    budget = ctx.budget
    if budget is None:
        return notes
    left, reports = budget.left_s(), budget_mod.reports_s(rows, plots)
    after = left - ceilings_s  # what the reports would have after the closing ceilings
    if after < reports:
        notes["ceilings"] = (f"the time limit of {budget.limit_s:g} s left {max(left, 0):.0f} s, "
                             f"less than the {ceilings_s:.0f} s they took at the start plus "
                             f"{reports:.0f} s for the reports")
        after = left  # skipped: their time goes to the reports
    if plots and after < reports:
        notes["plots"] = (f"the time limit of {budget.limit_s:g} s left {max(left, 0):.0f} s, "
                          f"less than the {reports:.0f} s kept for the reports with plots")
    return notes


class RowsWriter:
    """results.csv and results.json of the rows measured so far (`results.write`, each file in
    one rename), called after each shape: a run killed mid-way (a lease's `timeout -k`) leaves
    them, and `glai-bench render` or `merge` makes its summary and dispatch tables. A write
    happens between shapes, never while one is timed, and waits until twenty times the last
    one's cost has passed (0.12 s for 288 rows on this project's CPU), so it takes at most
    about a twentieth of the run."""

    def __init__(self, out_dir: Path, ctx: Context, info: dict,
                 meta_of: Callable[[Ceilings], dict]) -> None:
        self.out_dir, self.ctx, self.info, self.meta_of = out_dir, ctx, info, meta_of
        self.done, self.next_at, self.writes = 0, 0.0, 0

    def __call__(self, rows: list[dict]) -> None:
        self.done += 1
        began = time.monotonic()
        if began < self.next_at:
            return
        meta = {**self.meta_of(self.ctx.ceilings),
                "partial": f"written while running, after {self.done} shape(s); the closing "
                           "ceilings not measured yet"}
        results.write(results.table(rows, self.ctx.ceilings, self.info), self.out_dir, meta)
        self.writes += 1
        self.next_at = time.monotonic() + 20 * (time.monotonic() - began)
