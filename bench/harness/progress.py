"""Progress bars with an estimate of the time left, and the run's phase times.

`EtaBar` is the one progress bar of every long loop `glai-bench run` prints (the kernel
suite's shapes, bench/harness/runner.py; the pipeline's units, bench/pipeline/runner.py).
tqdm's own estimate assumes every item costs the same, which is wrong by 100× here (a
B = 16 shape against a B = 4096 one; a B unit of the pipeline against an A unit), and it
says nothing before the first item ends or while one long item runs. So each item carries a
predicted relative cost (`bench.harness.suite.case_cost`, `bench.pipeline.runner.unit_cost`),
and the time left is

    left = max(total cost × rate − elapsed,  cost not yet started × rate,
               the longest a running item still takes alone)

with `rate` the seconds per unit of cost measured over the items finished so far, the
preset's prior `prior_s_per_cost` counted in as a quarter of the run at its own rate (alone
before the first item ends; none at all: "estimating"). Items run
one at a time unless `jobs` > 1 (the pipeline's units in processes): then the rate is the
finished items' own durations over their cost, divided by `jobs`, since the wall time at
which the first ends also paid for the items still running beside it (measured by the
elapsed time alone, the first-run pipeline's estimate after its first unit was 2.3× the time
left; docs/notes/benchmarks.md, "The bars' estimates on a quiet first run (stop 51)"). A
thread redraws the bar every `tick_s` seconds, so the estimate counts down during a long item.

`Phases` times the named phases of a run and prints them with the total (`lines`).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager

# redraws a second while an item runs: often enough to see it move, rare enough for a log
TICK_S = 5.0
# the prior's weight in the rate once items have ended, as a share of the run's cost: with
# the first-run kernel bar's prior, its estimate after the first shape (24 s, torch.compile's
# first graphs included) said 13 min 10 s for 5 min 14 s left at none, 6 min 09 s at 0.25;
# over the run the worst ratio to the truth fell from 2.5 to 1.5 (docs/notes/benchmarks.md,
# "The bars' estimates on a quiet first run (stop 51)")
PRIOR_SHARE = 0.25


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: "42 s", "3 min 05 s", "1 h 02 min"."""
    if not math.isfinite(seconds):
        raise ValueError(f"seconds must be finite, got {seconds!r}")
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def format_eta(seconds: float | None) -> str:
    """The bar's estimate: "about 3 min 05 s left", or "estimating the time left" (None:
    nothing measured yet and no prior)."""
    if seconds is None:
        return "estimating the time left"
    return f"about {format_duration(seconds)} left"


def time_left(total_cost: float, done_cost: float, started_cost: float, elapsed_s: float,
              done_elapsed_s: float, prior_s_per_cost: float | None = None, *,
              jobs: int = 1, done_item_s: float | None = None,
              running: tuple[tuple[float, float], ...] = ()) -> float | None:
    """Seconds left of a run of `total_cost` (module docstring): `done_cost` finished,
    `started_cost` begun (finished or running), `elapsed_s` since the start, `done_elapsed_s`
    the elapsed time when the last item finished. With `jobs` > 1 items at once,
    `done_item_s` is the finished items' own durations summed (None: not all known) and
    `running` the (cost, seconds since it began) of each item running. None when there is
    no rate yet."""
    if done_cost > 0 and jobs > 1 and done_item_s is not None and done_item_s > 0:
        spent = done_item_s / jobs
    elif done_cost > 0 and done_elapsed_s > 0:
        spent = done_elapsed_s
    else:
        spent = None
    if spent is not None and prior_s_per_cost is not None:
        # the prior weighs as PRIOR_SHARE of the run measured at its rate, so that one item's
        # one-off costs (the first shape's compiles) do not swing the estimate
        weight = PRIOR_SHARE * total_cost
        rate = (spent + prior_s_per_cost * weight) / (done_cost + weight)
    elif spent is not None:
        rate = spent / done_cost
    elif prior_s_per_cost is not None:
        rate = prior_s_per_cost
    else:
        return None
    alone = max((cost * rate * jobs - age for cost, age in running), default=0.0)
    return max(total_cost * rate - elapsed_s, (total_cost - started_cost) * rate, alone, 0.0)


class EtaBar:
    """A tqdm bar over items with predicted costs, its postfix led by the time left.

    `costs`: {item key: predicted relative cost}, in the order the items start. `start(key,
    label)` when an item begins (the label follows the estimate), `finish(key)` when it ends
    (in any order: the pipeline's units end out of order). `update()` finishes the oldest
    unfinished item, for callers that only count. `jobs`: how many items run at once
    (`prior_s_per_cost` is then the elapsed seconds per unit of cost at that concurrency).
    Use as a context manager (the ticking thread stops at exit)."""

    def __init__(self, costs: Mapping[Hashable, float], *, desc: str, unit: str,
                 disable: bool = False, prior_s_per_cost: float | None = None,
                 tick_s: float = TICK_S, clock: Callable[[], float] = time.monotonic,
                 file=None, jobs: int = 1) -> None:
        from tqdm.auto import tqdm

        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs!r}")
        self.costs = dict(costs)
        self.total_cost = float(sum(self.costs.values()))
        self.prior_s_per_cost = prior_s_per_cost
        self.jobs = jobs
        self.clock = clock
        self.started_at = clock()
        self.done: set[Hashable] = set()
        self.started: set[Hashable] = set()
        self.began: dict[Hashable, float] = {}  # the clock when each started item began
        self.done_item_s: float | None = 0.0  # None once an item ended without a start
        self.done_elapsed_s = 0.0
        self.label = ""
        self._lock = threading.Lock()
        # tqdm's own `remaining` is dropped: it assumes equal items (module docstring)
        self.bar = tqdm(total=len(self.costs), desc=desc, unit=unit, disable=disable,
                        file=file if file is not None else sys.stderr,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        self._stop = threading.Event()
        self._ticker = None
        if not disable and tick_s > 0:
            self._ticker = threading.Thread(target=self._tick, args=(tick_s,), daemon=True)
            self._ticker.start()
        self._draw()

    def _cost(self, keys) -> float:
        return float(sum(self.costs[k] for k in keys))

    def seconds_left(self) -> float | None:
        """The estimate now (module docstring), or None before any rate is known."""
        with self._lock:
            now = self.clock()
            running = () if self.jobs == 1 else tuple(
                (self.costs[k], now - t) for k, t in self.began.items() if k not in self.done)
            return time_left(self.total_cost, self._cost(self.done),
                             self._cost(self.started | self.done),
                             now - self.started_at, self.done_elapsed_s,
                             self.prior_s_per_cost, jobs=self.jobs,
                             done_item_s=self.done_item_s, running=running)

    def item_seconds(self, key: Hashable) -> float | None:
        """Seconds since item `key` began (to now, even once it has ended), or None if it
        never started."""
        with self._lock:
            began = self.began.get(key)
            return None if began is None else self.clock() - began

    def postfix(self) -> str:
        left = self.seconds_left()
        eta = format_eta(left)
        if len(self.done) == len(self.costs):
            eta = "done"
        elif left is not None and left < 0.5:
            eta = "running past the estimate"  # the last items cost more than predicted
        return f"{eta}; {self.label}" if self.label else eta

    def _draw(self) -> None:
        self.bar.set_postfix_str(self.postfix(), refresh=True)

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            self._draw()

    def start(self, key: Hashable, label: str = "") -> None:
        """Item `key` begins; `label` says which (shown after the estimate)."""
        self._known(key)
        with self._lock:
            self.started.add(key)
            self.began.setdefault(key, self.clock())
            self.label = label
        self._draw()

    def set_postfix_str(self, label: str) -> None:
        """The label alone (tqdm's name for it), the estimate kept in front."""
        self.label = label
        self._draw()

    def finish(self, key: Hashable) -> None:
        """Item `key` ended (finished, failed or cut off: its time is spent either way)."""
        self._known(key)
        with self._lock:
            if key in self.done:
                raise ValueError(f"item {key!r} finished twice")
            now = self.clock()
            self.done.add(key)
            self.started.add(key)
            self.done_elapsed_s = now - self.started_at
            if key in self.began and self.done_item_s is not None:
                self.done_item_s += now - self.began[key]
            else:
                self.done_item_s = None  # an item's own time unknown: the elapsed rate
        self.bar.update(1)
        self._draw()

    def update(self, n: int = 1) -> None:
        """Finish the `n` oldest unfinished items (in the order of `costs`)."""
        for key in [k for k in self.costs if k not in self.done][:n]:
            self.finish(key)

    def _known(self, key: Hashable) -> None:
        if key not in self.costs:
            raise KeyError(f"no item {key!r} in this bar's costs")

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.bar.close()

    def __enter__(self) -> EtaBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Phases:
    """Wall-clock seconds per named phase of a run, in the order they ran, and the total
    since the object was made."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.started = clock()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name` (added to it when it ran before)."""
        began = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - began

    def add(self, name: str, seconds: float) -> None:
        """A phase timed elsewhere."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return self.clock() - self.started

    def lines(self, title: str) -> list[str]:
        """`title: N s in all (M min SS s)`, then one line per phase and what the phases
        leave out (start-up, imports) as "other"."""
        total = self.total()
        width = max([len(n) for n in self.seconds] + [len("other")])
        out = [f"{title}: {total:.0f} s in all ({format_duration(total)})"]
        out += [f"  {name:{width}}  {s:7.1f} s" for name, s in self.seconds.items()]
        other = total - sum(self.seconds.values())
        if other >= 0.5:
            out.append(f"  {'other':{width}}  {other:7.1f} s")
        return out
