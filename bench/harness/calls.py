"""One backend's call from its first run to its timing, as every sweep takes it: the dense
cases (runner.py) and the kept-fraction cases (kept.py) share these steps, so that both
measure alike and neither imports the other.

A measurement is a dict of result-row fields (`Measurement`): the steps below fill it, and a
call too slow to time or not run at all ends as a `skip` row with a note.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.harness.sweeps import Preset
from bench.harness.timing import sync, warm

Measurement = dict[str, object]

# a backend whose warmed-up call takes longer than this many times the preset's limit
# is not timed (an interpreter, a pathological size)
SLOW_FACTOR = 3.0
# a second call at least this long ends the warm-up
LONG_WARM_S = 0.1


def skip(note: str) -> Measurement:
    """A row that was not measured, saying why."""
    return {"status": "skipped", "note": note}


def first_calls(check: Callable[[], object], fn: Callable[[], object], device: torch.device,
                preset: Preset, m: Measurement) -> tuple[object, float] | None:
    """(check()'s result, the seconds of one call of fn after it), the first call's time in
    m["first_call_s"]; None, with m saying why, when that second call is too slow to time.
    The first call may compile; the second says whether timing is affordable, before the
    float64 oracle (the dearest part of a large case) is computed."""
    start = time.perf_counter()
    first = check()
    sync(device)
    m["first_call_s"] = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    sync(device)
    second = time.perf_counter() - start
    if second > SLOW_FACTOR * preset.max_call_s:
        m.update(skip(f"a call took {second:.3g} s, more than {SLOW_FACTOR:g}x the "
                      f"{preset.name} preset's limit of {preset.max_call_s} s"))
        return None
    return first, second


def warm_call_s(fn: Callable[[], object], device: torch.device, second_s: float) -> float:
    """The median warm call time that sizes the timing blocks: a call of `second_s` or more
    is warm after two (more warm-up would only cost time), a shorter one gets `timing.warm`."""
    return second_s if second_s >= LONG_WARM_S else warm(fn, device)[1]
