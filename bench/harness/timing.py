"""Timers: median and interquartile range of one call, after warm-up.

CPU: `torch.utils.benchmark.Timer` (all of torch's threads; gc off while timing). The
backends of one case are timed *interleaved*: round after round, each backend times one
block of calls, in an order that rotates every round. On a machine shared with other work,
load that comes and goes then lands on every backend alike, so the ratios between them (the
numbers this suite reports) hold even when absolute times drift. Each block is sized to
about `min_time_s / rounds`; a sample is one block's time per call.

CUDA: `triton.testing.do_bench` (CUDA events per call, the L2 cache flushed before each by
writing a buffer larger than it; the callers also rotate several input sets), or, without
triton, the same done here with CUDA events.

`time_calls` picks the one for the device; `warm` is the warm-up before either. The CPU timer
also serves the one-off studies (bench/studies/): a clock of their choice (the thread's CPU
time instead of the wall clock) and a thread count per function. `best_call` is the fastest
single call, for rates (the library GEMM's, a kernel's share of the peak). Nothing in bench/
times a call any other way.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.utils.benchmark as tb


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, quartiles, fastest, and how many samples they come from."""

    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    samples: int
    calls: int
    total_s: float = 0.0  # wall time spent timing, warm-ups included
    # each round's sample in round order, where the rounds interleave several fns
    # (`time_interleaved`): a round's samples of two fns are paired in time
    rounds: tuple[float, ...] = ()

    @property
    def iqr_s(self) -> float:
        return self.q75_s - self.q25_s

    @classmethod
    def of(cls, samples: list[float], calls: int) -> Timing:
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0], samples[0], 1, calls)
        q25, q50, q75 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(q50, q25, q75, min(samples), len(samples), calls)

    def fields(self) -> dict[str, object]:
        """The result row's timing columns."""
        return {"median_s": self.median_s, "q25_s": self.q25_s, "q75_s": self.q75_s,
                "iqr_s": self.iqr_s, "min_s": self.min_s, "samples": self.samples,
                "calls": self.calls}


def sync(device: torch.device) -> None:
    """Wait for `device`'s queued work (a CUDA call returns before it has run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm(fn: Callable[[], object], device: torch.device,
         warm_s: float = 0.05) -> tuple[float, float]:
    """Warm-up calls (at least three, and about `warm_s` in all, so that one-off costs such as
    first-touch page faults and allocator growth are behind us).

    Returns (fastest, median) call time; the median sizes the timing blocks.
    """
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < warm_s and len(times) < 1000):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times[1:])


def best_call(fn: Callable[[], object], min_time_s: float = 0.15,
              max_calls: int | None = 20, min_calls: int = 2,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest single call of `fn` on the CPU, after one warm-up call: calls until they span
    `min_time_s` (at least `min_calls`, at most `max_calls`; None: no cap), garbage collection
    off while timing. For a rate (a GEMM's, a kernel's share of a peak), where the fastest call
    is the one the machine's other work disturbed least."""
    fn()
    enabled = gc.isenabled()
    gc.disable()
    try:
        best, spent, calls = math.inf, 0.0, 0
        while calls < min_calls or (spent < min_time_s
                                    and (max_calls is None or calls < max_calls)):
            start = clock()
            fn()
            elapsed = clock() - start
            best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
        return best
    finally:
        if enabled:
            gc.enable()


# Shortest block: a block much shorter than a scheduler time slice (~4-24 ms) is either
# untouched or doubled by another process's slice, which makes medians jump; longer blocks
# average such hits out, equally for every backend.
MIN_BLOCK_S = 0.02


def block_size(per_call_s: float, min_time_s: float, rounds: int) -> int:
    """Calls per block so that `rounds` blocks take about `min_time_s` in all (and each
    block at least MIN_BLOCK_S)."""
    if per_call_s <= 0:
        return 1000
    target = max(min_time_s / rounds, MIN_BLOCK_S)
    return max(1, min(100_000, math.floor(target / per_call_s)))


# Timer.timeit warms up with max(number // 100, 2) calls before each block, which re-warms
# caches after the other backends' blocks; for a block of one call this long that warm-up
# would triple the cost and buy nothing, so such a call is timed on its own.
SINGLE_CALL_S = 0.05


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch at `n` threads inside (as torch.utils.benchmark's Timer sets them per block)."""
    previous = torch.get_num_threads()
    if n == previous:  # the common case: no pool resize
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _one_call(fn: Callable[[], object], clock: Callable[[], float], threads: int) -> float:
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _threads(threads):
            start = clock()
            fn()
            return clock() - start
    finally:
        if enabled:
            gc.enable()


def time_interleaved(fns: dict[str, Callable[[], object]], per_call_s: dict[str, float],
                     min_time_s: float, rounds: int,
                     clock: Callable[[], float] = time.perf_counter,
                     threads: Mapping[str, int] | None = None) -> dict[str, Timing]:
    """Time every fn (already warmed up) in interleaved rounds on the CPU.

    `per_call_s` is each fn's warm-up time, which sizes its blocks. `clock` reads the time
    (`time.thread_time`: this thread's CPU time, which leaves out the time the process waits
    for a core on a shared machine, and the other threads' work). `threads` gives a fn its own
    torch thread count while it runs (default: every fn at the current count), so thread
    counts can take turns inside each round too.
    """
    count = {name: torch.get_num_threads() for name in fns} | dict(threads or {})
    timers = {name: tb.Timer("fn()", globals={"fn": fn}, timer=clock, num_threads=count[name])
              for name, fn in fns.items()}
    number = {name: block_size(per_call_s[name], min_time_s, rounds) for name in fns}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    spent = dict.fromkeys(fns, 0.0)
    order = list(fns)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            if number[name] == 1 and per_call_s[name] >= SINGLE_CALL_S:
                samples[name].append(_one_call(fns[name], clock, count[name]))
            else:
                samples[name].append(timers[name].timeit(number[name]).median)
            spent[name] += time.perf_counter() - start
    return {name: dataclasses.replace(Timing.of(samples[name], number[name] * rounds),
                                      total_s=spent[name], rounds=tuple(samples[name]))
            for name in fns}


def time_calls(fns: dict[str, Callable[[], object]], per_call_s: dict[str, float],
               device: torch.device, min_time_s: float, rounds: int) -> dict[str, Timing]:
    """Time every fn (warmed up; `per_call_s` its warm call time) on `device`: interleaved
    rounds on the CPU, one fn after another under CUDA events on a GPU."""
    if not fns:
        return {}
    if device.type == "cuda":
        return {name: time_cuda(fn, device, min_time_s, per_call_s[name])
                for name, fn in fns.items()}
    return time_interleaved(fns, per_call_s, min_time_s, rounds)


def _flush_buffer(device: torch.device) -> torch.Tensor:
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 2**25
    return torch.empty(max(2 * l2, 2**28) // 4, dtype=torch.int32, device=device)


def time_cuda(fn: Callable[[], object], device: torch.device, min_time_s: float,
              per_call_s: float) -> Timing:
    """Median and quartiles of fn on a CUDA device, each call after an L2 flush; at least
    five timed calls."""
    rep_ms = max(25.0, 1000 * min_time_s, 5000 * per_call_s)
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    start = time.perf_counter()
    if do_bench is not None:
        times_ms = do_bench(fn, warmup=25, rep=rep_ms, return_mode="all")
        return dataclasses.replace(Timing.of([t / 1e3 for t in times_ms], len(times_ms)),
                                   total_s=time.perf_counter() - start)
    flush = _flush_buffer(device)
    n = max(5, min(10_000, round(rep_ms / 1000 / max(per_call_s, 1e-6))))
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize(device)
    times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    return dataclasses.replace(Timing.of(times, n), total_s=time.perf_counter() - start)
