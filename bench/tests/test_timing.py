"""bench/harness/timing.py beyond the suite's own use (test_suite.py has that): the clock and
per-function thread counts the studies time with, the device dispatch, the row's fields."""

from __future__ import annotations

import time

import pytest
import torch

from bench.harness import timing

CPU = torch.device("cpu")


def test_the_cpu_clock_leaves_out_time_spent_off_the_cpu():
    """A sleeping call costs wall time and almost no CPU time: with time.thread_time the
    interleaved timer reports the second."""
    fns = {"sleep": lambda: time.sleep(0.002)}
    wall = timing.time_interleaved(fns, {"sleep": 0.002}, min_time_s=0.06, rounds=3)
    cpu = timing.time_interleaved(fns, {"sleep": 0.002}, min_time_s=0.06, rounds=3,
                                  clock=time.thread_time)
    assert wall["sleep"].min_s >= 0.002
    assert cpu["sleep"].median_s < 0.0005


@pytest.mark.parametrize("per_call_s", [1e-5, timing.SINGLE_CALL_S])  # blocks, single calls
def test_each_function_runs_at_its_own_thread_count(per_call_s):
    seen: dict[str, set[int]] = {"one": set(), "two": set()}
    fns = {name: (lambda name=name: seen[name].add(torch.get_num_threads())) for name in seen}
    before = torch.get_num_threads()
    out = timing.time_interleaved(fns, dict.fromkeys(fns, per_call_s), min_time_s=0.01,
                                  rounds=2, threads={"one": 1, "two": 2})
    assert seen == {"one": {1}, "two": {2}}
    assert torch.get_num_threads() == before
    assert all(t.samples == 2 for t in out.values())


def test_interleaved_rounds_keep_each_rounds_sample_in_order():
    """`Timing.rounds`: one sample a round in round order, the one `min_s` and the quartiles
    come from; the study pairs two fns' samples of the same round."""
    naps = iter([0.004, 0.001, 0.003] * 2)  # "slow": one nap a round, in this order
    fns = {"slow": lambda: time.sleep(next(naps)), "quick": lambda: None}
    out = timing.time_interleaved(fns, {"slow": timing.SINGLE_CALL_S, "quick": 1e-6},
                                  min_time_s=0.003, rounds=3)
    slow = out["slow"].rounds
    assert len(slow) == 3 and len(out["quick"].rounds) == 3
    assert slow[0] > slow[2] > slow[1] >= 0.001  # the naps' order
    assert out["slow"].min_s == min(slow) and out["slow"].samples == 3


def test_time_calls_times_on_the_cpu_and_fills_the_rows_fields():
    assert timing.time_calls({}, {}, CPU, min_time_s=0.01, rounds=2) == {}
    fns = {"a": lambda: torch.ones(100).sum()}
    fastest, median = timing.warm(fns["a"], CPU, warm_s=0.01)
    assert 0 < fastest <= median
    out = timing.time_calls(fns, {"a": median}, CPU, min_time_s=0.02, rounds=3)
    fields = out["a"].fields()
    assert set(fields) == {"median_s", "q25_s", "q75_s", "iqr_s", "min_s", "samples", "calls"}
    assert fields["samples"] == 3 and 0 < fields["min_s"] <= fields["median_s"]


def test_best_call_is_the_fastest_single_call_within_its_bounds():
    durations = iter([0.5, 0.003, 0.001, 0.002] + [0.004] * 100)  # the first is the warm-up
    clock_now = [0.0]
    calls = []

    def fn():
        calls.append(1)
        clock_now[0] += next(durations)

    best = timing.best_call(fn, min_time_s=0.006, max_calls=20, clock=lambda: clock_now[0])
    # the warm-up's 0.5 s is not a sample; calls stop once they span 6 ms: 3 + 1 + 2
    assert best == pytest.approx(0.001) and len(calls) == 4
    capped = timing.best_call(lambda: clock_now.__setitem__(0, clock_now[0] + 1.0),
                              min_time_s=100.0, max_calls=3, clock=lambda: clock_now[0])
    assert capped == pytest.approx(1.0)
    counted = []
    timing.best_call(lambda: counted.append(1), min_time_s=0.0, min_calls=5)
    assert len(counted) == 6  # one warm-up, then at least min_calls
