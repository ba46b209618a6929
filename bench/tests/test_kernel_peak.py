"""`glai-bench kernel-peak`: each kernel's share of the peak measured beside it."""

from __future__ import annotations

import re

import pytest

from bench.harness import native_peak
from bench.studies import kernel_peak
from glai_kernels import extension


@pytest.fixture(scope="module")
def runnable():
    if extension.load().error is not None:
        pytest.skip("the cpp extension is unavailable here")
    if kernel_peak.PEAK_KERNEL not in native_peak.available_kernels():
        pytest.skip(f"no {kernel_peak.PEAK_KERNEL} peak kernel on this CPU")


def _shares(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"(?:forward|dweight|dx)\s+([\d.]+)%", text)]


def test_every_kernel_gets_a_share_of_the_peak_below_one(runnable, capsys):
    """A small batch (fast), one round: three shares, each a physical fraction (a kernel
    faster than the FMA peak would mean a wrong count or ceiling)."""
    kernel_peak.main(["--batches", "16", "--rounds", "1", "--threads", "1"])
    found = _shares(capsys.readouterr().out)
    assert len(found) == 3
    assert all(0 < v <= 100 for v in found), found


def test_a_target_above_the_peak_is_missed(runnable, capsys):
    assert kernel_peak.main(["--batches", "16", "--rounds", "1", "--threads", "1",
                             "--target", "1.01"]) == 1
    assert "MISSED: forward B=16 1t, dweight B=16 1t, dx B=16 1t" in capsys.readouterr().out


def test_the_ceiling_is_the_best_peak_sample_on_either_side_of_the_kernels(monkeypatch):
    """Runs without the extension: the peak is sampled before the kernels and after each
    round, and a slow first sample (a busy moment of a shared host) does not set it."""
    samples = iter([1e9, 2e9, 4e9])
    order: list[str] = []

    def fake_rate(kernel, threads, min_time_s):
        order.append("peak")
        return next(samples)

    def kernel():
        order.append("kernel")

    monkeypatch.setattr(kernel_peak.native_peak, "fma_rate", fake_rate)
    monkeypatch.setattr(kernel_peak, "kernel_calls", lambda head, batch: ({"forward": kernel}, 2e6))
    monkeypatch.setattr(kernel_peak, "best_call", lambda fn, **_: (fn(), 1e-3)[1])
    peak, got = kernel_peak.shares("A1", 16, 1, rounds=2)
    assert peak == 4e9 and got == {"forward": 0.5}  # 2 MFLOP in 1 ms against 4 GFLOP/s
    assert order == ["peak", "kernel", "peak", "kernel", "peak"]
