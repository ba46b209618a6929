"""NVML energy windows that start and end at the counter's updates (bench/harness/energy.py).

The counter holds its value between updates, tens of milliseconds apart on a GPU; a window read
between updates is off at each end by up to a period's energy. The fake NVML here updates every
PERIOD_S at a constant power, so the true power is known and each reading's error is measured.
"""

from __future__ import annotations

import math
import sys
import time
import types

import pytest
import torch

from bench.harness import energy as energy_mod
from bench.harness.energy import EnergyMeter

WATTS = 300.0
PERIOD_S = 0.1


def _stepped_counter(start: float):
    """Millijoules at WATTS, updated every PERIOD_S only (as NVML's counter is)."""
    def read(handle):
        steps = math.floor((time.perf_counter() - start) / PERIOD_S)
        return int(WATTS * 1e3 * steps * PERIOD_S)
    return read


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetTotalEnergyConsumption=_stepped_counter(time.perf_counter()),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return fake


def test_windows_aligned_with_the_counters_updates_read_the_true_power(fake_nvml):
    """Five 0.3 s windows over a counter updated every 100 ms: read between updates, the two
    ends' staleness would move a reading by up to 100/300 of it (33%); aligned, each end is
    known to one batch of calls (BATCH_S, up to twice that on a loaded machine)."""
    meter = EnergyMeter(torch.device("cuda", 0), window_s=0.3)
    assert meter.available, meter.reason
    bound = 0.09  # a batch of 10 ms (20 on a loaded machine) over 300 ms, and 2% to spare
    for _ in range(5):
        time.sleep(PERIOD_S * 0.37)  # another phase of the counter each time
        reading = meter.measure(lambda: time.sleep(0.001), per_call_s=0.001)
        assert reading.window_s >= 0.3
        assert reading.watts == pytest.approx(WATTS, rel=bound), reading
        assert reading.joules_per_call == pytest.approx(
            reading.watts * reading.window_s / reading.calls)


def test_a_counter_that_never_moves_is_not_waited_for_forever(fake_nvml):
    fake_nvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: 1234
    meter = EnergyMeter(torch.device("cuda", 0), window_s=0.1)
    started = time.perf_counter()
    reading = meter.measure(lambda: time.sleep(0.001), per_call_s=0.001)
    assert reading.joules_per_call == 0.0 and reading.watts == 0.0
    assert time.perf_counter() - started < 0.1 + 2 * energy_mod.UPDATE_WAIT_S + 0.5
