"""Tests of the physical ceilings (bench/harness/physical.py, bench/harness/native_peak.py,
bench/harness/ceilings.py) and of the 100% guard (bench/harness/shares.py): over fake machines
and devices, a planted result above its floor, every committed run under reports/, and a fresh
tiny run."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.harness import ceilings, native_peak, shares, suite
from bench.harness.ceilings import LIBRARY_GEMM, Ceilings
from bench.harness.passes import PASSES
from bench.harness.physical import Machine, cpu_compute_ceiling, cuda_datasheet_peak
from bench.harness.sweeps import Preset, Sweep
from bench.reporting import ceilings_report
from glai_kernels import extension, extension_build
from glai_kernels.contract import Shape

REPORTS = Path(__file__).resolve().parents[2] / "reports"
ZEN5 = Machine(frozenset({"avx512f", "avx2", "avx512bf16"}), 2,
               {"avx512_f32": (250e9, 400e9), "avx2_f32": (125e9, 250e9),
                "avx512_f64": (125e9, 250e9), "avx2_f64": (62e9, 124e9),
                "avx512bf16": (470e9, 950e9)})


# ---------------------------------------------------------------- the ceiling choice

def test_the_best_instruction_set_sets_the_ceiling():
    # 2 threads: the higher of the 2-thread measurement and twice one thread's
    assert cpu_compute_ceiling(ZEN5, "float32") == (500e9, "avx512_f32 peak kernel, "
                                                           "2 x the 1-thread rate")
    rate, how = cpu_compute_ceiling(ZEN5, "bfloat16")
    assert rate == 950e9 and how == "avx512bf16 peak kernel, measured at 2 threads"
    assert cpu_compute_ceiling(ZEN5, "float64")[0] == 250e9
    # float16 has no kernel of its own: the float32 FMA peak (the kernels widen to float32)
    assert cpu_compute_ceiling(ZEN5, "float16")[0] == 500e9


def test_amx_tiles_set_the_bfloat16_ceiling_and_float16_sums_do_not():
    # a Sapphire-Rapids-like description: AMX tiles, AVX512-FP16 FMA at twice float32's rate
    spr = Machine(frozenset({"avx512f", "avx2", "avx512bf16", "amx_bf16", "avx512fp16"}), 2,
                  {"avx512_f32": (130e9, 250e9), "avx512bf16": (260e9, 500e9),
                   "amx_bf16": (1900e9, 3700e9), "avx512_f16": (260e9, 500e9)})
    assert cpu_compute_ceiling(spr, "bfloat16") == (3800e9, "amx_bf16 peak kernel, "
                                                            "2 x the 1-thread rate")
    # float16 products are summed in float32 (the contract): float16 FMA is no ceiling
    assert cpu_compute_ceiling(spr, "float16") == cpu_compute_ceiling(spr, "float32")
    # tiles the OS did not grant (no "amx_bf16" instruction set) leave vdpbf16ps the ceiling
    denied = Machine(spr.isas - {"amx_bf16"}, 2, spr.rates)
    assert cpu_compute_ceiling(denied, "bfloat16")[0] == 520e9
    # the report lists the float16 FMA's rate and says it bounds nothing
    c = Ceilings({"float32": 1e11}, 1e10, peak_flops={"float32": 2.6e11}, threads=2,
                 peak_kernels={k: list(v) for k, v in spr.rates.items()})
    lines = {line.split("|")[1].strip(): line for line in ceilings_report.table_lines(c.as_dict())
             if line.startswith("| peak kernel")}
    assert "not a ceiling" in lines["peak kernel avx512_f16"]
    assert "not a ceiling" not in lines["peak kernel amx_bf16"]


def test_a_cpu_without_avx512_gets_the_avx2_ceiling():
    # a rate for an instruction set it lacks (a stale or foreign entry) is ignored
    avx2 = Machine(frozenset({"avx2"}), 1, {"avx2_f32": (125e9, 120e9),
                                            "avx512_f32": (250e9, 250e9)})
    assert cpu_compute_ceiling(avx2, "float32") == (125e9, "avx2_f32 peak kernel, "
                                                           "1 x the 1-thread rate")
    # no AVX512_BF16: bfloat16 is bounded by the float32 FMA peak
    assert cpu_compute_ceiling(avx2, "bfloat16")[0] == 125e9
    rate, how = cpu_compute_ceiling(Machine(frozenset(), 4), "float32")
    assert math.isnan(rate) and "no peak kernel" in how


def test_cuda_datasheet_peak_from_device_properties():
    h100 = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132,
                                 clock_rate=1_980_000)
    rate, how = cuda_datasheet_peak(h100, "bfloat16")
    assert rate == pytest.approx(132 * 1.98e9 * 4096)  # about 1070 TFLOP/s dense
    assert "132 SMs" in how
    a100 = types.SimpleNamespace(major=8, minor=0, multi_processor_count=108,
                                 clock_rate=1_410_000)
    assert cuda_datasheet_peak(a100, "float16")[0] == pytest.approx(312e12, rel=0.01)
    assert cuda_datasheet_peak(a100, "float32")[0] == pytest.approx(19.5e12, rel=0.01)
    assert math.isnan(cuda_datasheet_peak(types.SimpleNamespace(
        major=6, minor=1, multi_processor_count=20, clock_rate=1_500_000), "float32")[0])
    assert math.isnan(cuda_datasheet_peak(types.SimpleNamespace(
        major=9, minor=0, multi_processor_count=132, clock_rate=0), "float32")[0])


def test_the_floor_uses_the_physical_peak_and_labels_the_fallback():
    c = Ceilings({"float32": 2e11}, 4e10, peak_flops={"float32": 5e11},
                 peak_how={"float32": "avx512_f32"}, triad_bytes_per_s=5e10)
    assert c.physical and c.compute_peak("float32") == (5e11, "avx512_f32")
    assert c.floor_s(10**12, 1, "float32") == pytest.approx(2.0)
    assert c.bandwidth(10**9) == (5e10, "memory")  # the higher of copy and triad
    # an old result (no physical fields): the library GEMM, labelled so
    old = Ceilings(**{"matmul_flops": {"float32": 2e11}, "copy_bytes_per_s": 4e10})
    assert not old.physical and old.compute_peak("float32") == (2e11, LIBRARY_GEMM)
    l2 = Ceilings({"float32": 1e11}, 1e10, cache_copy_bytes_per_s=1e11, cache_bytes=2**25,
                  l2_bytes=2**22, l2_triad_bytes_per_s=4e11)
    assert l2.bound(1, 2**20, "float32") == "L2" and l2.bound(1, 2**23, "float32") == "cache"
    best = old.best_of(c)
    assert best.peak_flops == {"float32": 5e11} and best.triad_bytes_per_s == 5e10


# ---------------------------------------------------------------- the native kernels

def _native_or_skip() -> list[str]:
    if native_peak.load() is not None:
        pytest.skip(f"glai_peak not built here: {native_peak.load()}")
    kernels = native_peak.available_kernels()
    if not kernels:
        pytest.skip("no x86 peak kernel runs on this CPU")
    return kernels


def test_native_peaks_and_triad_run():
    kernels = _native_or_skip()
    for kernel in kernels:
        rate = native_peak.fma_rate(kernel, 1, min_time_s=0.005, rounds=1)
        assert math.isfinite(rate) and rate > 1e9
    assert native_peak.triad_rate(2**20, 2, min_time_s=0.005) > 1e9  # checks its result


def test_the_clock_is_a_core_clock_and_agrees_with_the_fma_peak():
    """clock_ghz: a chain of dependent adds of a register, one a cycle. Such a chain can run
    no faster than one add a cycle (its result checks that none was dropped), so the clock can
    only read low: an add taking two cycles would halve it. Adds of an immediate would not do:
    Intel's renamer folds several a cycle (an Emerald Rapids read 16 "GHz", caught here).
    The one-core FMA peak over it is then at most the widest x86 core's 64 float32 FLOPs a
    cycle (2 FMA pipes × 16 lanes × 2) and at least a 256-bit single-pipe core's 16, with a
    margin for a core that clocks down for vector work (some Intel parts under AVX-512) and
    for the two being timed at different moments."""
    kernels = _native_or_skip()
    ghz = native_peak.clock_ghz(min_time_s=0.02)
    assert 0.5 < ghz < 7.0
    kernel = "avx512_f32" if "avx512_f32" in kernels else "avx2_f32"
    flops_a_cycle = native_peak.fma_rate(kernel, 1, min_time_s=0.02) / (ghz * 1e9)
    assert 12 < flops_a_cycle < 64 * 1.15, flops_a_cycle
    with pytest.raises(RuntimeError, match="iterations > 0"):
        torch.ops.glai_peak.clock(0)


def test_a_failed_build_degrades_to_a_labelled_fallback(monkeypatch):
    monkeypatch.setattr(extension_build, "missing_tools", lambda: "no C++ compiler (test)")
    native_peak.load.cache_clear()
    try:
        fields = ceilings.cpu_physical(("float32",), 0.01)
    finally:
        native_peak.load.cache_clear()
    assert "no C++ compiler (test)" in fields["peak_error"] and "peak_flops" not in fields
    c = Ceilings({"float32": 2e11}, 4e10, **fields)
    assert c.compute_peak("float32") == (2e11, LIBRARY_GEMM)
    table = "\n".join(ceilings_report.table_lines(c.as_dict()))
    assert f"{LIBRARY_GEMM}, fallback" in table and "no C++ compiler (test)" in table


# ---------------------------------------------------------------- the 100% guard

def _row(shape: Shape, median_s: float, pass_: str = "forward") -> dict:
    return {"backend": "cpp", **shape.as_dict(), "dtype": "float32", "pass": pass_,
            "status": "ok", "median_s": median_s}


def test_a_planted_share_above_100_percent_is_rejected():
    c = Ceilings({"float32": 1e11}, 1e10, peak_flops={"float32": 1e11})
    shape = Shape(256, 385, 128, 37)
    floor = c.floor_s(PASSES["both"].flops(shape), PASSES["both"].min_bytes(shape, 4),
                      "float32")
    rows = pd.DataFrame([_row(shape, 2 * floor, "both"), _row(shape, floor / 1.5, "both")])
    got = shares.recompute(rows, c)
    assert got.tolist() == pytest.approx([50.0, 150.0])
    bad = shares.over_limit(rows, got)
    assert len(bad) == 1 and "150% (model wrong)" in shares.describe(bad)[0]
    flagged = "\n".join(ceilings_report.over_limit_lines(rows.assign(roofline_pct=got)))
    assert "1 results above 100% of the roofline: model wrong" in flagged
    assert ceilings_report.flag(150.0) == " ⚠ model wrong" and ceilings_report.flag(99) == ""


@pytest.mark.parametrize("path", shares.committed_runs(REPORTS),
                         ids=lambda p: str(p.relative_to(REPORTS)))
def test_no_committed_result_above_100_percent(path: Path):
    stale, bad = shares.check_run(path)
    if stale:
        pytest.skip(f"{path.relative_to(REPORTS)}: {stale}")
    assert not bad, "\n".join(bad)


def test_a_fresh_tiny_run_stays_under_100_percent():
    preset = Preset(name="tiny-shares", description="test preset",
                    sweeps=(Sweep("heads", ("A2",), "batch", (2, 16)),),
                    dtypes=("float32",), min_time_s=0.01, rounds=2, max_call_s=1.0,
                    ceiling_time_s=0.03)
    backends = ["einsum", "torch"] + (["cpp"] if extension.cpu_availability("cpu") is None
                                      else [])
    out = suite.run(preset, device="cpu", backends=backends, plots=False, progress=False,
                    log=lambda _: None)
    assert out.meta["ceilings"]["peak_flops"] or out.meta["ceilings"]["peak_error"]
    rows = out.table
    assert rows["roofline_pct"].notna().any()
    recomputed = shares.recompute(rows, Ceilings(**out.meta["ceilings"]))
    assert recomputed.dropna().tolist() == pytest.approx(rows["roofline_pct"].dropna().tolist())
    assert not shares.describe(shares.over_limit(rows, recomputed))


def test_the_guard_over_committed_runs_bites_once_they_have_physical_ceilings(tmp_path):
    shape = Shape(16, 385, 128, 37)
    c = Ceilings({"float32": 2e11}, 4e10, peak_flops={"float32": 5e11})
    floor = c.floor_s(PASSES["forward"].flops(shape), PASSES["forward"].min_bytes(shape, 4),
                      "float32")
    run = {"ceilings": c.as_dict(), "rows": [_row(shape, floor / 2)]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(run))
    assert shares.committed_runs(tmp_path) == [path]
    stale, bad = shares.check_run(path)
    assert stale is None and len(bad) == 1 and "200%" in bad[0]
    # the same run without physical ceilings cannot be judged: the guard says why
    run["ceilings"] = {"matmul_flops": {"float32": 2e11}, "copy_bytes_per_s": 4e10}
    path.write_text(json.dumps(run))
    assert shares.check_run(path) == (shares.STALE, [])


def test_a_dram_sized_benchmark_outgrows_a_large_last_level_cache(monkeypatch):
    monkeypatch.setattr(ceilings, "last_level_cache_bytes", lambda: 32 * 2**20)
    assert ceilings.beyond_cache(ceilings.CPU_TRIAD_BYTES, 3) == ceilings.CPU_TRIAD_BYTES
    monkeypatch.setattr(ceilings, "last_level_cache_bytes", lambda: 300 * 2**20)
    assert ceilings.beyond_cache(ceilings.CPU_TRIAD_BYTES, 3) == 900 * 2**20
