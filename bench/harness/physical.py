"""Which physical compute ceiling judges a case: the CPU's from measured peak kernels, a GPU's
from its datasheet (SM count × clock × per-SM throughput).

CPU. A case's ceiling is the peak of the best instruction set the CPU has for its dtype,
whatever the backend uses: a kernel that leaves AVX-512 unused is short of what the machine
can do, and its share says so.

    float32, float64   AVX-512 FMA, else AVX2 FMA (2 FLOPs per lane)
    bfloat16           AMX `tdpbf16ps` tiles where the OS grants them, else AVX512_BF16
                       `vdpbf16ps` (2 products + 2 adds per float32 lane: 4 FLOPs), else
                       the float32 FMA peak (the kernels widen to float32); both of the
                       first two add into float32 sums, as the op's contract requires
    float16            the float32 FMA peak. The op sums float16 products in float32, and no
                       instruction these CPUs have multiplies float16 into float32 sums but
                       the float32 FMA after widening; AVX512-FP16's FMA (float16 sums) is
                       measured and reported beside it (`avx512_f16`), not a ceiling here.

At the run's N threads the ceiling is the higher of the N-thread measurement and N times the
one-thread one: a core cannot go faster when its neighbours also run, and on a shared machine
an N-thread measurement carries other people's load, so N × one thread is the safe upper bound.

GPU. `cuda_datasheet_peak` multiplies `multi_processor_count`, `clock_rate` (the maximum SM
clock, kHz) and a per-architecture table of FLOPs per SM per clock (dense; CUDA cores for
float32, tensor cores for float16/bfloat16/float64 where the architecture has them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# dtype -> the peak kernels (bench/harness/native_peak.py KERNELS) that can bound it, best first
CPU_KERNELS_FOR: dict[str, tuple[str, ...]] = {
    "float32": ("avx512_f32", "avx2_f32"),
    "float64": ("avx512_f64", "avx2_f64"),
    "bfloat16": ("amx_bf16", "avx512bf16", "avx512_f32", "avx2_f32"),
    "float16": ("avx512_f32", "avx2_f32"),
}
# peak kernels measured and reported that bound no dtype of the op, and why
NOT_A_CEILING: dict[str, str] = {
    "avx512_f16": "float16 sums: not a ceiling (the op sums float16 products in float32)"}
KERNEL_ISA: dict[str, str] = {"avx512_f32": "avx512f", "avx512_f64": "avx512f",
                              "avx2_f32": "avx2", "avx2_f64": "avx2",
                              "avx512bf16": "avx512bf16", "amx_bf16": "amx_bf16",
                              "avx512_f16": "avx512fp16"}


@dataclass(frozen=True)
class Machine:
    """A CPU as the ceiling choice sees it: its instruction sets, the run's thread count and
    the measured FLOP/s of each peak kernel as (one thread, `threads` threads)."""

    isas: frozenset[str]
    threads: int
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)


def cpu_compute_ceiling(machine: Machine, dtype: str) -> tuple[float, str]:
    """(FLOP/s, how) of `dtype`'s ceiling at the machine's thread count: the highest rate
    among the kernels for `dtype` whose instruction set it has; (NaN, why) when none ran."""
    best, how = math.nan, f"no peak kernel measured for {dtype}"
    for kernel in CPU_KERNELS_FOR.get(dtype, ()):
        if KERNEL_ISA[kernel] not in machine.isas or kernel not in machine.rates:
            continue
        one, many = machine.rates[kernel]
        scaled = machine.threads * one
        rate = max(many, scaled)
        if not rate > 0 or (math.isfinite(best) and rate <= best):
            continue
        best = rate
        source = (f"{machine.threads} x the 1-thread rate" if scaled >= many
                  else f"measured at {machine.threads} threads")
        how = f"{kernel} peak kernel, {source}"
    return best, how


# (major, minor) -> FLOPs per SM per clock, dense: float32 on CUDA cores, the others on tensor
# cores where the architecture has them (float64: FMA units before sm_80).
CUDA_FLOPS_PER_SM_CLOCK: dict[tuple[int, int], dict[str, float]] = {
    (7, 0): {"float32": 128, "float64": 64, "float16": 1024},
    (7, 5): {"float32": 128, "float64": 4, "float16": 1024},
    (8, 0): {"float32": 128, "float64": 128, "float16": 2048, "bfloat16": 2048},
    (8, 6): {"float32": 256, "float64": 4, "float16": 1024, "bfloat16": 1024},
    (8, 9): {"float32": 256, "float64": 4, "float16": 1024, "bfloat16": 1024},
    (9, 0): {"float32": 256, "float64": 256, "float16": 4096, "bfloat16": 4096},
    (10, 0): {"float32": 256, "float64": 256, "float16": 8192, "bfloat16": 8192},
}


def cuda_datasheet_peak(props: object, dtype: str) -> tuple[float, str]:
    """(FLOP/s, how) from a device's properties (`torch.cuda.get_device_properties`, or any
    object with major, minor, multi_processor_count and clock_rate in kHz); NaN when its
    architecture or clock is not known."""
    arch = (int(getattr(props, "major", 0)), int(getattr(props, "minor", 0)))
    per_clock = CUDA_FLOPS_PER_SM_CLOCK.get(arch, {}).get(dtype)
    clock_khz = getattr(props, "clock_rate", 0) or 0
    if per_clock is None or clock_khz <= 0:
        return math.nan, f"no datasheet entry for sm_{arch[0]}{arch[1]} {dtype} or no clock"
    sms = int(props.multi_processor_count)
    return (sms * clock_khz * 1e3 * per_clock,
            f"datasheet: {sms} SMs x {clock_khz / 1e6:.3g} GHz x {per_clock:g} FLOP/SM/clock "
            f"(sm_{arch[0]}{arch[1]}, dense)")
