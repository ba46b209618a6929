"""The machine's ceilings, measured in the same run as the kernels they judge.

- Compute, physical (the roofline's ceiling): native peak kernels (`bench.harness.native_peak`,
  glai_kernels/csrc/cpu/peak.cpp) per instruction set and dtype the CPU has, at one thread
  and at the run's thread count; the ceiling for a dtype is the best instruction set's rate
  (`bench.harness.physical.cpu_compute_ceiling` says which and why). On CUDA the datasheet peak
  from the device's properties (`bench.harness.physical.cuda_datasheet_peak`), or the measured
  matmul where that is higher.
- Compute, reference ("library GEMM"): a large square matmul per dtype (`a @ b`, 2·n³
  FLOPs), the sizes growing until one call takes long enough to be compute-bound (or a size
  cap); the best rate reached. A line on the plots, not the ceiling: on this project's CPU
  MKL runs AVX2 code and reaches about half the physical peak. If the peak kernels cannot
  be built, the ceiling falls back to it, labelled so (`peak_error` says why).
- Memory: a STREAM-style triad a[i] = b[i] + s·c[i] (bytes of the three arrays, each once;
  the write-allocate read of `a` is not counted) and a large copy (`dst.copy_(src)`, read
  plus written bytes), well beyond the last-level cache; the higher of the two. On a CPU the
  same once more at a size that fits in the last-level cache: the CPU benchmarks re-run a
  call on the same inputs (as a training loop re-reads its weights), so a case whose bytes
  fit in half the cache is judged against the cache's bandwidth, not main memory's (a
  hierarchical roofline). On a GPU every call is timed after an L2 flush on rotating
  inputs, so main memory's bandwidth applies throughout.

Each rate is the *best* sample (the fastest single call), not the median: a ceiling is what
the machine can do, and on a shared machine the median carries other people's load. The
suite measures the ceilings before and after its cases (and briefly between them on a CPU)
and keeps the higher of each. A kernel's roofline floor is then
max(FLOPs / peak[dtype], bytes / bandwidth), and "% of roofline" is that floor over its
measured median: above 100% means the model (a ceiling or a count) is wrong.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.harness.passes import dtype_of
from bench.harness.timing import best_call

CPU_MATMUL_SIZES = (256, 512, 1024, 2048)
CUDA_MATMUL_SIZES = (2048, 4096, 8192)
CPU_COPY_BYTES = 256 * 2**20
CUDA_COPY_BYTES = 2**30
# a size whose call takes this long is compute-bound: stop growing
LONG_CALL_S = 0.1


LIBRARY_GEMM = "library GEMM"
CPU_TRIAD_BYTES = 384 * 2**20
# timed a quarter at a time: short rounds, never cached (the slice read was last touched
# three quarters ago, more than the last-level cache: see beyond_cache)
TRIAD_SLICES = 4


def beyond_cache(nbytes: int, multiple: int) -> int:
    """`nbytes`, or `multiple` times the last-level cache where that is more: a DRAM-sized
    benchmark must not fit in the cache of a server CPU (300 MiB on one this suite ran on)."""
    return max(nbytes, multiple * last_level_cache_bytes())


@dataclass
class Ceilings:
    """Peak FLOP/s per dtype name: physical (`peak_flops`, the ceiling) and the library GEMM's
    (`matmul_flops`, a reference); bandwidths (bytes/s) from main memory and, on a CPU, from
    the last-level cache (copy and triad; the higher is the ceiling); with how they were got.
    Older results carry no physical fields: their compute ceiling was the library GEMM."""

    matmul_flops: dict[str, float]
    copy_bytes_per_s: float
    cache_copy_bytes_per_s: float = math.nan
    cache_bytes: int = 0
    details: dict[str, str] = field(default_factory=dict)
    matmul_sizes: dict[str, int] = field(default_factory=dict)
    peak_flops: dict[str, float] = field(default_factory=dict)
    peak_how: dict[str, str] = field(default_factory=dict)
    # peak kernel -> [FLOP/s at 1 thread, at `threads` threads]
    peak_kernels: dict[str, list[float]] = field(default_factory=dict)
    threads: int = 0
    triad_bytes_per_s: float = math.nan
    cache_triad_bytes_per_s: float = math.nan
    peak_error: str | None = None
    # the run's threads' private caches together (L2 per core x threads) and their triad rate
    l2_bytes: int = 0
    l2_triad_bytes_per_s: float = math.nan

    @property
    def physical(self) -> bool:
        """Whether the compute ceilings are physical peaks (else the library GEMM's rate)."""
        return bool(self.peak_flops)

    def compute_peak(self, dtype: str) -> tuple[float, str]:
        """(FLOP/s, label) of `dtype`'s compute ceiling: its physical peak, else (build
        failed, dtype not measured, or an old result) the library GEMM's rate, so labelled."""
        peak = self.peak_flops.get(dtype, math.nan)
        if math.isfinite(peak) and peak > 0:
            return peak, self.peak_how.get(dtype, "physical peak")
        return self.matmul_flops.get(dtype, math.nan), LIBRARY_GEMM

    def bandwidth(self, nbytes: int) -> tuple[float, str]:
        """(bytes/s, "L2", "cache" or "memory"): the threads' L2 caches' when `nbytes` fits
        in half of them, the last-level cache's when in half of it (a CPU benchmark re-runs
        on the same inputs, which then stay cached), else main memory's."""
        if (self.l2_bytes and nbytes <= self.l2_bytes // 2
                and math.isfinite(self.l2_triad_bytes_per_s)):
            return self.l2_triad_bytes_per_s, "L2"
        cache = _best(self.cache_copy_bytes_per_s, self.cache_triad_bytes_per_s)
        if self.cache_bytes and nbytes <= self.cache_bytes // 2 and math.isfinite(cache):
            return cache, "cache"
        return _best(self.copy_bytes_per_s, self.triad_bytes_per_s), "memory"

    def floor_s(self, flops: int, nbytes: int, dtype: str) -> float:
        """The roofline's lower bound on time; NaN if this dtype's peak was not measured."""
        return max(flops / self.compute_peak(dtype)[0], nbytes / self.bandwidth(nbytes)[0])

    def bound(self, flops: int, nbytes: int, dtype: str) -> str:
        """"compute", or the memory level ("L2", "cache", "memory") that sets the floor."""
        bandwidth, level = self.bandwidth(nbytes)
        return "compute" if flops / self.compute_peak(dtype)[0] >= nbytes / bandwidth else level

    def as_dict(self) -> dict:
        return asdict(self)

    def best_of(self, other: Ceilings) -> Ceilings:
        """Each ceiling at the higher of the two measurements (a ceiling is the best seen)."""
        peaks, how = dict(self.peak_flops), dict(self.peak_how)
        for k, v in other.peak_flops.items():
            if not v <= peaks.get(k, 0.0):
                peaks[k], how[k] = v, other.peak_how.get(k, "")
        kernels = {k: [_best(a, b) for a, b in zip(v, other.peak_kernels.get(k, v), strict=True)]
                   for k, v in self.peak_kernels.items()}
        return Ceilings(
            {k: max(self.matmul_flops.get(k, 0.0), other.matmul_flops.get(k, 0.0))
             for k in {**self.matmul_flops, **other.matmul_flops}},
            max(self.copy_bytes_per_s, other.copy_bytes_per_s),
            _best(self.cache_copy_bytes_per_s, other.cache_copy_bytes_per_s)
            if self.cache_bytes else self.cache_copy_bytes_per_s,
            self.cache_bytes,
            {**other.details, **self.details,
             "measured": "the fastest call seen: at the start, briefly between cases (CPU), "
                         "and at the end of the run"},
            {**other.matmul_sizes, **self.matmul_sizes},
            peaks, how, {**other.peak_kernels, **kernels}, self.threads or other.threads,
            _best(self.triad_bytes_per_s, other.triad_bytes_per_s),
            _best(self.cache_triad_bytes_per_s, other.cache_triad_bytes_per_s),
            self.peak_error if self.physical or not other.physical else other.peak_error,
            self.l2_bytes or other.l2_bytes,
            _best(self.l2_triad_bytes_per_s, other.l2_triad_bytes_per_s),
        )


def _best(a: float, b: float) -> float:
    """The higher of two rates, a NaN (not measured) losing to a number."""
    return max((v for v in (a, b) if math.isfinite(v)), default=math.nan)


def cache_bytes_at(level: int) -> int:
    """cpu0's data or unified cache of `level` in bytes (from sysfs), 0 when unknown."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if int((index / "level").read_text()) != level or (
                    index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    return 0


def last_level_cache_bytes() -> int:
    """The CPU's largest cache in bytes (from sysfs), 0 when unknown."""
    best_level, size = 0, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        if level > best_level:
            best_level, size = level, value
    return size


def _best_seconds(fn, device: torch.device, min_time_s: float) -> float:
    """The fastest single call of fn over about min_time_s (after one warm-up call).

    Single calls, not blocks: on a loaded machine the fastest call is the one that ran
    undisturbed, which is what a ceiling is.
    """
    if device.type == "cuda":
        from bench.harness.timing import time_cuda

        fn()
        torch.cuda.synchronize(device)
        return time_cuda(fn, device, min_time_s, per_call_s=0.0).min_s
    return best_call(fn, min_time_s, max_calls=None, min_calls=3)


def matmul_peak(dtype: torch.dtype, device: torch.device, min_time_s: float = 0.2,
                sizes: tuple[int, ...] | None = None) -> tuple[float, int]:
    """(best FLOP/s, at size n) of an n x n matmul over growing sizes."""
    sizes = sizes or (CUDA_MATMUL_SIZES if device.type == "cuda" else CPU_MATMUL_SIZES)
    gen = torch.Generator().manual_seed(0)
    best, best_n = 0.0, 0
    for n in sizes:
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        seconds = _best_seconds(lambda a=a, b=b: a @ b, device, min_time_s)
        if 2 * n**3 / seconds > best:
            best, best_n = 2 * n**3 / seconds, n
        if seconds > LONG_CALL_S:
            break
    return best, best_n


def copy_bandwidth(device: torch.device, nbytes: int | None = None,
                   min_time_s: float = 0.2) -> float:
    """Best bytes/s (read + written) of a copy between two buffers of `nbytes`."""
    nbytes = nbytes or (CUDA_COPY_BYTES if device.type == "cuda"
                        else beyond_cache(CPU_COPY_BYTES, 1))
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, min_time_s)
    return 2 * nbytes / seconds


def cpu_physical(dtypes: tuple[str, ...], min_time_s: float, threads: int | None = None,
                 llc: int = 0, triads: bool = True, rounds: int = 3) -> dict:
    """The physical fields of `Ceilings` on this CPU: every peak kernel it can run at one
    thread and at `threads` (default torch.get_num_threads()), the ceiling per dtype, and the
    triad's bandwidth (with `triads`) DRAM-sized, sized to half the threads' L2 caches and
    (with `llc`) to half the last-level cache. A
    failed build gives only `peak_error`."""
    from bench.harness import native_peak
    from bench.harness.physical import KERNEL_ISA, Machine, cpu_compute_ceiling

    threads = threads or torch.get_num_threads()
    error = native_peak.load()
    if error is not None:
        return {"peak_error": error, "threads": threads}
    kernels = {k: [native_peak.fma_rate(k, n, min_time_s, rounds) for n in (1, threads)]
               for k in native_peak.available_kernels()}
    if not kernels:
        return {"peak_error": "no peak kernel for this CPU's instruction sets (x86-64 "
                              "AVX2/AVX-512 only)", "threads": threads}
    machine = Machine(frozenset(KERNEL_ISA[k] for k in kernels), threads,
                      {k: (v[0], v[1]) for k, v in kernels.items()})
    chosen = {d: cpu_compute_ceiling(machine, d) for d in dtypes}
    triad_bytes = beyond_cache(CPU_TRIAD_BYTES, 3)
    triad = (max(native_peak.triad_rate(triad_bytes, n, min_time_s, TRIAD_SLICES)
                 for n in {1, threads})
             if triads else math.nan)
    cache = (max(native_peak.triad_rate(llc // 2, n, min_time_s) for n in {1, threads})
             if llc and triads else math.nan)
    l2 = cache_bytes_at(2) if triads else 0
    # private caches: n threads do at most n times one thread's rate, and at least what
    # was measured with n (on a shared machine the n-thread sample carries others' load)
    l2_rate = (max(threads * native_peak.triad_rate(l2 // 2, 1, min_time_s),
                   native_peak.triad_rate(threads * l2 // 2, threads, min_time_s))
               if l2 else math.nan)
    return {"peak_flops": {d: v for d, (v, _) in chosen.items() if math.isfinite(v)},
            "peak_how": {d: how for d, (_, how) in chosen.items()},
            "peak_kernels": kernels, "threads": threads, "triad_bytes_per_s": triad,
            "cache_triad_bytes_per_s": cache, "l2_bytes": threads * l2,
            "l2_triad_bytes_per_s": l2_rate}


def cuda_physical(device: torch.device, dtypes: tuple[str, ...],
                  matmul_flops: dict[str, float]) -> dict:
    """The physical fields on a GPU: the datasheet peak per dtype, or the measured matmul
    where that is higher (a datasheet entry can lag a part's real clock)."""
    from bench.harness.physical import cuda_datasheet_peak

    props = torch.cuda.get_device_properties(device)
    peaks, how = {}, {}
    for name in dtypes:
        sheet, text = cuda_datasheet_peak(props, name)
        measured = matmul_flops.get(name, math.nan)
        if math.isfinite(sheet) and not measured > sheet:
            peaks[name], how[name] = sheet, text
        elif math.isfinite(measured):
            peaks[name], how[name] = measured, f"{LIBRARY_GEMM} (above the datasheet: {text})"
    return {"peak_flops": peaks, "peak_how": how}


def measure(device: torch.device, dtypes: tuple[str, ...], min_time_s: float = 0.3) -> Ceilings:
    """Ceilings for every dtype of the run on `device`."""
    flops, details, sizes = {}, {}, {}
    for name in dtypes:
        peak, n = matmul_peak(dtype_of(name), device, min_time_s)
        flops[name], sizes[name] = peak, n
        details[f"matmul_{name}"] = f"{n}x{n} @ {n}x{n}, fastest call"
    nbytes = CUDA_COPY_BYTES if device.type == "cuda" else beyond_cache(CPU_COPY_BYTES, 1)
    bandwidth = copy_bandwidth(device, nbytes, min_time_s)
    details["copy"] = f"copy_ of {nbytes // 2**20} MiB float32, read + write bytes"
    llc = last_level_cache_bytes() if device.type == "cpu" else 0
    physical = (cpu_physical(dtypes, min_time_s / 3, llc=llc) if device.type == "cpu"
                else cuda_physical(device, dtypes, flops))
    ceilings = Ceilings(flops, bandwidth, details=details, matmul_sizes=sizes, **physical)
    if device.type == "cpu":
        details["peak"] = ("native peak kernels (glai_kernels/csrc/cpu/peak.cpp): 12 independent "
                           "FMA chains per thread, 2 FLOPs per lane; bfloat16 vdpbf16ps, "
                           "4 FLOPs per float32 lane (2 products, 2 adds); AMX tdpbf16ps, "
                           "four independent 16x16 float32 tiles, 16,384 FLOPs a product")
        triad_mib = beyond_cache(CPU_TRIAD_BYTES, 3) // 2**20
        details["triad"] = (f"triad a = b + s*c, {triad_mib} MiB over three "
                            "float32 arrays timed a quarter at a time, each array counted once "
                            "(write-allocate not counted), best of 1 and the run's threads")
    if llc:
        # source and destination together fill half the cache
        ceilings.cache_bytes = llc
        ceilings.cache_copy_bytes_per_s = copy_bandwidth(device, llc // 4, min_time_s)
        details["cache_copy"] = (f"copy_ of {llc // 4 // 2**10} KiB float32 (last-level cache "
                                 f"{llc // 2**20} MiB), read + write bytes")
        details["cache_triad"] = f"triad over {llc // 2 // 2**10} KiB (three arrays together)"
    if ceilings.l2_bytes:
        details["l2_triad"] = (f"triad over half of {ceilings.l2_bytes // 2**10} KiB (the run's "
                               "threads' L2 caches), the higher of the threads together and "
                               "threads x one thread")
    return ceilings


def refresh(ceilings: Ceilings, device: torch.device, min_time_s: float = 0.03) -> Ceilings:
    """A brief re-measurement (at the matmul sizes found before) kept where it is higher.

    On a shared CPU a ceiling measured once may land in someone else's busy moment;
    sampling again between cases catches the machine's quiet ones.
    """
    flops = {name: matmul_peak(dtype_of(name), device, min_time_s,
                               sizes=(ceilings.matmul_sizes.get(name, 1024),))[0]
             for name in ceilings.matmul_flops}
    copy = copy_bandwidth(device, None, min_time_s)
    cache = (copy_bandwidth(device, ceilings.cache_bytes // 4, min_time_s)
             if ceilings.cache_bytes else math.nan)
    physical = (cpu_physical(tuple(ceilings.peak_flops), min_time_s / 3, ceilings.threads or None,
                             triads=False, rounds=1) if ceilings.physical else {})
    return ceilings.best_of(Ceilings(flops, copy, cache, ceilings.cache_bytes, **physical))
