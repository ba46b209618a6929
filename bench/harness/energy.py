"""Energy per call and mean power on NVIDIA GPUs, from NVML's total-energy counter.

`nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver loaded and is
updated every few tens of milliseconds, so a reading is taken over a window of at least a
second of back-to-back calls that starts and ends at the counter's updates: joules per call =
energy over the window / calls, mean power = energy / window. Everywhere else (the CPU, a GPU
without the counter, no nvidia-ml-py) the meter says why it is absent; nothing is estimated in
its place. A reading whose mean power is above the board's enforced power limit is refused
(`ImplausibleEnergyError`): a window too short for the counter's updates gives such readings
(an H200 read 1,140 W over 0.1 s, stop 33).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_WINDOW_S = 1.0
# calls between two looks at the counter once the window is long enough: the window's end is
# known to within one such batch
BATCH_S = 0.01
# the longest wait for the counter to move, at either end of a window
UPDATE_WAIT_S = 0.5


class ImplausibleEnergyError(ValueError):
    """A reading above the board's power limit: the counter, not the call, is off."""


@dataclass(frozen=True)
class Energy:
    joules_per_call: float
    watts: float
    window_s: float
    calls: int


class EnergyMeter:
    """Reads one CUDA device's energy counter; `reason` says why not when it cannot."""

    def __init__(self, device: torch.device, window_s: float = MIN_WINDOW_S) -> None:
        self.handle = None
        self.reason: str | None = None
        self.window_s = window_s
        self.limit_w: float | None = None
        if window_s <= 0:
            self.reason = "turned off (an energy window of 0 s)"
            return
        if device.type != "cuda":
            self.reason = f"no energy counter on {device.type} (NVML covers NVIDIA GPUs only)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self._read = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            try:
                self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3
            except Exception:  # not every board reports it; then no reading is refused
                self.limit_w = None
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as e:  # NVMLError_NotSupported and friends
            self.handle = None
            self.reason = f"NVML energy counter unavailable: {e}"
        self.device = device

    @property
    def available(self) -> bool:
        return self.handle is not None

    def measure(self, fn: Callable[[], object], per_call_s: float,
                min_window_s: float | None = None) -> Energy | None:
        """Energy of back-to-back calls of fn over at least `min_window_s` (default: the
        meter's window); raises ImplausibleEnergyError above the board's power limit.

        The window starts and ends at updates of the counter (it holds its value for tens of
        milliseconds between them): it opens when the counter next moves, and after
        `min_window_s` the calls go on, in batches of about BATCH_S, until it moves again.
        Read between updates instead, each end would be stale by up to a period: tens of
        percent over 0.1 s, still up to a few percent over 1 s."""
        if not self.available:
            return None
        min_window_s = self.window_s if min_window_s is None else min_window_s
        calls_per_batch = max(1, int(BATCH_S / max(per_call_s, 1e-7)))
        torch.cuda.synchronize(self.device)
        start_mj, start = self._update(self._read())
        calls, mark = 0, None
        while True:
            for _ in range(calls_per_batch):
                fn()
            calls += calls_per_batch
            torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            window = now - start
            if window < min_window_s:
                continue
            reading = self._read()
            if mark is None:
                mark, closing = reading, now
            # a counter that has not moved for UPDATE_WAIT_S is not waited for any longer
            if reading != mark or now - closing > UPDATE_WAIT_S:
                break
        joules = (reading - start_mj) / 1e3
        if self.limit_w is not None and joules / window > self.limit_w:
            raise ImplausibleEnergyError(
                f"{joules / window:.0f} W over {window:.2f} s is above the board's "
                f"{self.limit_w:.0f} W limit: the window is too short for NVML's counter")
        return Energy(joules / calls, joules / window, window, calls)

    def _update(self, last: int) -> tuple[int, float]:
        """(the counter's next value after `last`, when it was read), the device idle: the
        window's start (given up after UPDATE_WAIT_S, for a counter that does not move)."""
        since = time.perf_counter()
        while True:
            reading, now = self._read(), time.perf_counter()
            if reading != last or now - since > UPDATE_WAIT_S:
                return reading, now

    def describe(self) -> str:
        """What the results' energy columns are, for the report."""
        if not self.available:
            return f"absent: {self.reason}"
        text = f"NVML total-energy counter, windows of at least {self.window_s:g} s"
        if self.window_s < MIN_WINDOW_S:
            text += (f" (shorter than the {MIN_WINDOW_S:g} s the counter's updates need: "
                     "rough readings)")
        return text


def _physical_index(index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES may renumber them for torch."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if index < len(entries) and entries[index].isdigit():
            return int(entries[index])
        # GPU UUIDs (as container runtimes set them): torch's own mapping to NVML's numbers,
        # a private helper, so any failure keeps torch's index
        try:
            return int(torch.cuda._get_nvml_device_index(index))
        except Exception:
            pass
    return index
