"""The CPU's physical ceilings, measured by native microbenchmarks (glai_kernels/csrc/cpu/peak.cpp).

The library `glai_peak` is built just in time like glai_ext (`glai_kernels.extension_build`: the
same compiler, flags and cache root, in a directory of its own per source hash), but apart from it:
a failed build here leaves the kernels alone and makes `load()` return the reason, which the
ceilings then carry as their label (the fallback is the library GEMM's rate, flagged).

- `fma_rate(kernel, threads)`: FLOP/s of `threads` threads each issuing 12 independent chains
  of FMA (float32/float64, AVX-512 or AVX2; float16 with AVX512-FP16) or bf16 dot products
  (`vdpbf16ps`: 2 products and 2 adds per float32 lane, 4 FLOPs per lane), or four
  independent AMX tile products (`tdpbf16ps`, 16 x 32 by 32 x 16 bf16 into float32: 16,384
  FLOPs each), on finite, non-denormal values.
- `clock_ghz()`: the core's clock, from a chain of dependent adds of a register (one a cycle) on
  this thread: what turns a kernel's seconds per entry into cycles without assuming a clock.
- `triad_rate(nbytes, threads)`: bytes/s of a[i] = b[i] + s·c[i] on three float32 arrays of
  `nbytes` together, counting each array once (3·n·4 bytes, STREAM's convention: the
  write-allocate read of `a` that a cache without streaming stores does is *not* counted,
  so the rate is what the kernels' byte counts, which also count each tensor once, compare with).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from glai_kernels import extension_build

SOURCE = extension_build.CSRC / "cpu" / "peak.cpp"
_S = TypeVar("_S")  # one timed run's result (`_sized`)
LIBRARY = "glai_peak"
# kernel name in peak.cpp -> (instruction set it needs, dtype whose ceiling it measures)
# one timed run of a peak kernel lasts about this long (see fma_rate)
SAMPLE_S = 0.002
KERNELS: dict[str, tuple[str, str]] = {
    "avx512_f32": ("avx512f", "float32"),
    "avx2_f32": ("avx2", "float32"),
    "avx512_f64": ("avx512f", "float64"),
    "avx2_f64": ("avx2", "float64"),
    "avx512bf16": ("avx512bf16", "bfloat16"),
    "amx_bf16": ("amx_bf16", "bfloat16"),
    "avx512_f16": ("avx512fp16", "float16"),
}


def _directory():
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (*extension_build.CFLAGS, *extension_build.LDFLAGS, extension_build.cxx_compiler(),
                 torch.__version__):
        h.update(part.encode() + b"\0")
    return extension_build.cache_root() / f"{LIBRARY}-{torch.__version__}-{h.hexdigest()[:16]}"


@functools.cache
def load() -> str | None:
    """Build (or load from the cache) the glai_peak library once per process; None when its
    ops are usable, else why not (the build's error, summarised)."""
    missing = extension_build.missing_tools()
    if missing is not None:
        return f"cannot build {LIBRARY}: {missing}"
    directory = _directory()
    library = directory / f"{LIBRARY}.so"
    try:
        if library.exists():
            torch.ops.load_library(str(library))
            return None
        from torch.utils.cpp_extension import load as jit_load

        directory.mkdir(parents=True, exist_ok=True)
        jit_load(name=LIBRARY, sources=[str(SOURCE)], extra_cflags=list(extension_build.CFLAGS),
                 extra_ldflags=list(extension_build.LDFLAGS), build_directory=str(directory),
                 is_python_module=False, verbose=bool(os.environ.get(extension_build.VERBOSE_ENV)))
    except Exception as error:  # a ceiling that cannot be measured must not stop the run
        return f"building {LIBRARY} failed: {type(error).__name__}: {str(error)[-300:]}"
    return None


def _require() -> None:
    error = load()
    if error is not None:
        raise RuntimeError(error)


def supports(isa: str) -> bool:
    """Whether this CPU has `isa` ("avx512f", "avx2" with FMA, "avx512bf16", "avx512fp16",
    "amx_bf16": the tiles, granted by the OS)."""
    _require()
    return bool(torch.ops.glai_peak.supports(isa))


def available_kernels() -> list[str]:
    """The peak kernels this CPU can run (empty when the library is not loaded)."""
    if load() is not None:
        return []
    return [k for k, (isa, _) in KERNELS.items() if supports(isa)]


def fma_rate(kernel: str, threads: int, min_time_s: float = 0.05, rounds: int = 3) -> float:
    """Best FLOP/s of `kernel` on `threads` threads: the fastest of short runs (about
    SAMPLE_S each) repeated for about min_time_s, at least `rounds` of them.

    Short runs, not one long one: on a shared machine a run longer than the scheduler's time
    slice is almost always interrupted, while some short ones run undisturbed, as the timed
    kernels' calls (milliseconds) do; a ceiling measured with long runs would fall below
    what those calls reach."""
    _require()
    iterations, (seconds, flops) = _sized(
        lambda n: torch.ops.glai_peak.fma(kernel, n, threads), lambda sample: sample[0])
    best, samples, start = flops / seconds, 1, time.perf_counter()
    while samples < rounds or time.perf_counter() - start < min_time_s:
        seconds, flops = torch.ops.glai_peak.fma(kernel, iterations, threads)
        best, samples = max(best, flops / seconds), samples + 1
    return best


def _sized(run: Callable[[int], _S], seconds_of: Callable[[_S], float]) -> tuple[int, _S]:
    """(iterations, the last sample): `run(iterations)` grown until one run takes SAMPLE_S,
    so the clock's own cost vanishes in it."""
    iterations = 1 << 10
    while True:
        sample = run(iterations)
        seconds = seconds_of(sample)
        if seconds >= SAMPLE_S or iterations > 1 << 34:
            return iterations, sample
        iterations = int(iterations * max(2.0, 1.2 * SAMPLE_S / max(seconds, 1e-7)))


def clock_ghz(min_time_s: float = 0.05, rounds: int = 3) -> float:
    """The core's clock in GHz while this thread runs integer work: the fastest of short runs
    (about SAMPLE_S each, see fma_rate) of a chain of dependent adds, one a cycle. A core
    running vector work may clock lower (some Intel parts under AVX-512) or the same (AMD)."""
    _require()
    iterations, best = _sized(torch.ops.glai_peak.clock, float)
    samples, start = 1, time.perf_counter()
    while samples < rounds or time.perf_counter() - start < min_time_s:
        best, samples = min(best, torch.ops.glai_peak.clock(iterations)), samples + 1
    return iterations * 100 / best / 1e9


def triad_rate(nbytes: int, threads: int, min_time_s: float = 0.05,
               slices: int = 1) -> float:
    """Best bytes/s of a triad over three float32 arrays of `nbytes` together (each counted
    once). With `slices` > 1 each timed round covers one slice of the arrays, the slices in
    turn, so a round stays short (see fma_rate) while the slice it reads was last touched
    `slices - 1` slices ago: out of cache when the other slices exceed it (DRAM-sized)."""
    _require()
    n = max(16, nbytes // 12 // slices * slices)
    b, c = torch.ones(n), torch.full((n,), 0.5)
    a = torch.empty(n)
    m = n // slices
    views = [(a[k * m:(k + 1) * m], b[k * m:(k + 1) * m], c[k * m:(k + 1) * m])
             for k in range(slices)]
    torch.ops.glai_peak.triad(a, b, c, 0.25, 1, threads)  # touch every page once
    best, samples, start = math.inf, 0, time.perf_counter()
    while samples < 3 * slices or time.perf_counter() - start < min_time_s:
        va, vb, vc = views[samples % slices]
        # within one slice, one round when the slices rotate (the next round would find it
        # cached), several otherwise (cache-sized: the rounds after the first are the point)
        best = min(best, torch.ops.glai_peak.triad(va, vb, vc, 0.25, 1 if slices > 1 else 8,
                                                   threads))
        samples += 1
    if not math.isclose(float(a[-1]), 1.125):
        raise RuntimeError("glai_peak::triad computed a wrong result")
    return 3 * m * 4 / best
