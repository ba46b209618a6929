"""`glai-bench sparse-kernels-floor --step`: the engineered ratio's model with the fused step's
sparse kernels at their floors (bench/studies/sparse_kernels_floor.py). The arithmetic on
made-up times, the labels, and one real run at A1 (a few seconds)."""

from __future__ import annotations

import pytest

from bench.studies import sparse_kernels_floor as floor
from glai_kernels import extension


def test_the_model_replaces_the_kernels_by_k_entries_at_the_floors():
    m = floor.step_model(fused=300e-6, mlp=250e-6, forward=100e-6, dvalues_adam=120e-6,
                         nnz=100_000, ghz=4.0)
    assert m.rest == pytest.approx(80e-6) and m.ratio == pytest.approx(1.2)
    # 100,000 entries at (1.0 + 1.6) and (1.5 + 1.6) cycles at 4 GHz: 65 and 77.5 µs
    assert m.at_floor == pytest.approx((145e-6, 157.5e-6))
    assert m.ratio_at_floor == pytest.approx((0.58, 0.63))
    with pytest.raises(ValueError, match="part of the fused step"):
        floor.step_model(fused=200e-6, mlp=250e-6, forward=100e-6, dvalues_adam=120e-6,
                         nnz=1, ghz=4.0)


def test_the_model_is_printed_only_where_its_floors_hold():
    timed = {"GLAI fused": 300e-6, "MLP engineered": 250e-6, "forward in step": 100e-6,
             "dvalues+Adam in step": 120e-6}
    line = floor.report_step("B1", 16, 100_000, timed, 4.0, "avx512")
    assert "ratio 1.20 measured" in line
    assert "Model (not measured)" in line and "= 145-157 µs: ratio 0.58-0.63" in line
    for batch, isa in ((32, "avx512"), (16, "avx2")):
        line = floor.report_step("C2", batch, 100_000, timed, 4.0, isa)
        assert "ratio 1.20 measured; no floor model" in line and "Model" not in line


def test_a_real_run_at_a1(capsys):
    if extension.load().error is not None:
        pytest.skip("the cpp extension is unavailable here")
    assert floor.main(["--heads", "A1", "--repeats", "1", "--step"]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("A1 step (B = 16, K = "))
    assert "ratio" in line and "measured" in line


def test_the_clock_is_given_measured_or_assumed_with_the_reason(monkeypatch):
    from bench.harness import native_peak

    assert floor.clock_of(3.5) == (3.5, "3.5 GHz (given)")
    monkeypatch.setattr(native_peak, "load", lambda: "no C++ compiler (test)")
    ghz, label = floor.clock_of(None)
    assert ghz == 4.2 and "assumed" in label and "no C++ compiler (test)" in label
    monkeypatch.setattr(native_peak, "load", lambda: None)

    def not_x86():
        raise RuntimeError("glai_peak::clock: x86 only\nmore")

    monkeypatch.setattr(native_peak, "clock_ghz", not_x86)
    assert floor.clock_of(None) == (4.2, "an assumed 4.2 GHz (the clock was not measured: "
                                         "glai_peak::clock: x86 only)")
    monkeypatch.setattr(native_peak, "clock_ghz", lambda: 3.14159)
    assert floor.clock_of(None) == (3.14159, "3.14 GHz (measured: dependent integer adds on "
                                              "this thread)")


def test_without_the_extension_it_says_so(monkeypatch, capsys):
    import types

    monkeypatch.setattr(extension, "load", lambda: types.SimpleNamespace(error="no compiler"))
    with pytest.raises(SystemExit) as stop:
        floor.main(["--heads", "A1"])
    assert stop.value.code == 2 and "no compiler" in capsys.readouterr().err
