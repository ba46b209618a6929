"""summary.md's ceilings table and its flag on shares above 100% (bench/reporting/summary.py
calls these).

`c` is the run's `Ceilings.as_dict()` as results.json records it; older runs lack the
physical fields and show the library GEMM as their (then) ceiling.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.harness.ceilings import LIBRARY_GEMM
from bench.harness.physical import NOT_A_CEILING
from bench.harness.shares import LIMIT_PCT, MODEL_WRONG


def _gflops(v: float) -> str:
    return f"{v / 1e9:.1f} GFLOP/s" if math.isfinite(v) else "not measured"


def _gbps(v: float | None) -> str:
    return f"{v / 1e9:.1f} GB/s" if v is not None and math.isfinite(v) else "not measured"


def table_lines(c: dict) -> list[str]:
    """Markdown rows (with header) of every ceiling: the physical compute ceilings, the peak
    kernels at one and N threads, the library GEMM reference, and the bandwidths."""
    details, threads = c.get("details", {}), c.get("threads") or "N"
    lines = ["| ceiling | value | how |", "|---|---|---|"]
    peaks = c.get("peak_flops") or {}
    for dtype in c["matmul_flops"]:
        if dtype in peaks:
            lines.append(f"| **compute {dtype}** (the ceiling) | {_gflops(peaks[dtype])} | "
                         f"{c.get('peak_how', {}).get(dtype, '')} |")
        else:
            why = c.get("peak_error") or "no physical peak recorded"
            lines.append(f"| **compute {dtype}** (the ceiling: {LIBRARY_GEMM}, fallback) | "
                         f"{_gflops(c['matmul_flops'][dtype])} | {why} |")
    for n, (kernel, (one, many)) in enumerate((c.get("peak_kernels") or {}).items()):
        how = details.get("peak", "") if n == 0 else "the same"
        if kernel in NOT_A_CEILING:
            how = f"{how}; {NOT_A_CEILING[kernel]}"
        lines.append(f"| peak kernel {kernel} | {_gflops(one)} (1 thread), {_gflops(many)} "
                     f"({threads} threads) | {how} |")
    for dtype, flops in c["matmul_flops"].items():
        lines.append(f"| {LIBRARY_GEMM} {dtype} (reference, not the ceiling) | {_gflops(flops)} "
                     f"| {details.get('matmul_' + dtype, '')} |")
    lines.append(f"| copy | {_gbps(c['copy_bytes_per_s'])} | {details.get('copy', '')} |")
    if "triad_bytes_per_s" in c:
        lines.append(f"| triad | {_gbps(c['triad_bytes_per_s'])} | {details.get('triad', '')} |")
    if c.get("cache_bytes"):
        lines.append(f"| copy in cache | {_gbps(c['cache_copy_bytes_per_s'])} | "
                     f"{details.get('cache_copy', '')} |")
        if "cache_triad_bytes_per_s" in c:
            lines.append(f"| triad in cache | {_gbps(c['cache_triad_bytes_per_s'])} | "
                         f"{details.get('cache_triad', '')} |")
    if c.get("l2_bytes"):
        lines.append(f"| triad in L2 | {_gbps(c.get('l2_triad_bytes_per_s'))} | "
                     f"{details.get('l2_triad', '')} |")
    lines += ["", "The memory ceiling at each level is the higher of copy and triad."]
    return lines


def flag(share: float) -> str:
    """What a winner cell appends to a share: a warning above 100%."""
    return f" ⚠ {MODEL_WRONG}" if pd.notna(share) and share > LIMIT_PCT else ""


def over_limit_lines(df: pd.DataFrame) -> list[str]:
    """A section naming every timed row above 100% of its roofline, or nothing."""
    bad = df[df["roofline_pct"] > LIMIT_PCT]
    if bad.empty:
        return []
    lines = [f"**{len(bad)} results above 100% of the roofline: {MODEL_WRONG}.** A kernel "
             "cannot beat the hardware; a ceiling is too low or a count too high "
             "(docs/ARCHITECTURE.md §2.4). They are:", ""]
    for _, r in bad.iterrows():
        lines.append(f"- {r['backend']} {r['pass']} {r['dtype']} B={r['batch']} "
                     f"I={r['inputs']} P={r['paths']} O={r['outputs']}: "
                     f"{r['roofline_pct']:.0f}%")
    return [*lines, ""]
