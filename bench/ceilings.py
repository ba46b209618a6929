"""The machine's ceilings, measured in the same run as the kernels they judge.

- Compute: a large square matmul per dtype (`a @ b`, 2·n³ FLOPs), the sizes growing until
  one call takes long enough to be compute-bound (or a size cap); the best rate reached.
- Memory: a large copy (`dst.copy_(src)`, well beyond the last-level cache), counting the
  bytes read plus the bytes written. On a CPU also a copy that fits in the last-level
  cache: the CPU benchmarks re-run a call on the same inputs (as a training loop re-reads
  its weights), so a case whose bytes fit in half the cache is judged against the cache's
  bandwidth, not main memory's (a hierarchical roofline). On a GPU every call is timed after
  an L2 flush on rotating inputs, so main memory's bandwidth applies throughout.

Each rate is the *best* sample (the fastest single call), not the median: a ceiling is what
the machine can do, and on a shared machine the median carries other people's load. The
suite measures the ceilings before and after its cases and keeps the higher of each. A kernel's
roofline floor is then max(FLOPs / peak[dtype], bytes / bandwidth), and "% of roofline" is
that floor over its measured median.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.passes import dtype_of

CPU_MATMUL_SIZES = (256, 512, 1024, 2048)
CUDA_MATMUL_SIZES = (2048, 4096, 8192)
CPU_COPY_BYTES = 256 * 2**20
CUDA_COPY_BYTES = 2**30
# a size whose call takes this long is compute-bound: stop growing
LONG_CALL_S = 0.1


@dataclass
class Ceilings:
    """Peak FLOP/s per dtype name; copy bandwidth (bytes/s) from main memory and, on a CPU,
    from the last-level cache; with how they were got."""

    matmul_flops: dict[str, float]
    copy_bytes_per_s: float
    cache_copy_bytes_per_s: float = math.nan
    cache_bytes: int = 0
    details: dict[str, str] = field(default_factory=dict)
    matmul_sizes: dict[str, int] = field(default_factory=dict)

    def bandwidth(self, nbytes: int) -> tuple[float, str]:
        """(bytes/s, "cache" or "memory"): the cache's when `nbytes` fits in half of it
        (a CPU benchmark re-runs on the same inputs, which then stay cached)."""
        if self.cache_bytes and nbytes <= self.cache_bytes // 2 and math.isfinite(
                self.cache_copy_bytes_per_s):
            return self.cache_copy_bytes_per_s, "cache"
        return self.copy_bytes_per_s, "memory"

    def floor_s(self, flops: int, nbytes: int, dtype: str) -> float:
        """The roofline's lower bound on time; NaN if this dtype's peak was not measured."""
        peak = self.matmul_flops.get(dtype, math.nan)
        return max(flops / peak, nbytes / self.bandwidth(nbytes)[0])

    def bound(self, flops: int, nbytes: int, dtype: str) -> str:
        """"compute", or the memory level ("cache", "memory") that sets the floor."""
        peak = self.matmul_flops.get(dtype, math.nan)
        bandwidth, level = self.bandwidth(nbytes)
        return "compute" if flops / peak >= nbytes / bandwidth else level

    def as_dict(self) -> dict:
        return asdict(self)

    def best_of(self, other: Ceilings) -> Ceilings:
        """Each ceiling at the higher of the two measurements (a ceiling is the best seen)."""
        return Ceilings(
            {k: max(v, other.matmul_flops.get(k, 0.0)) for k, v in self.matmul_flops.items()},
            max(self.copy_bytes_per_s, other.copy_bytes_per_s),
            max(self.cache_copy_bytes_per_s, other.cache_copy_bytes_per_s)
            if self.cache_bytes else self.cache_copy_bytes_per_s,
            self.cache_bytes,
            {**self.details, "measured": "the fastest call seen: at the start, briefly between "
                                         "cases (CPU), and at the end of the run"},
            {**other.matmul_sizes, **self.matmul_sizes},
        )


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
        from bench.timing import time_cuda

        fn()
        torch.cuda.synchronize(device)
        return time_cuda(fn, device, min_time_s, per_call_s=0.0).min_s
    fn()
    best, calls, start = math.inf, 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < min_time_s:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        calls += 1
    return best


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
    nbytes = nbytes or (CUDA_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, min_time_s)
    return 2 * nbytes / seconds


def measure(device: torch.device, dtypes: tuple[str, ...], min_time_s: float = 0.3) -> Ceilings:
    """Ceilings for every dtype of the run on `device`."""
    flops, details, sizes = {}, {}, {}
    for name in dtypes:
        peak, n = matmul_peak(dtype_of(name), device, min_time_s)
        flops[name], sizes[name] = peak, n
        details[f"matmul_{name}"] = f"{n}x{n} @ {n}x{n}, fastest call"
    nbytes = CUDA_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    bandwidth = copy_bandwidth(device, nbytes, min_time_s)
    details["copy"] = f"copy_ of {nbytes // 2**20} MiB float32, read + write bytes"
    ceilings = Ceilings(flops, bandwidth, details=details, matmul_sizes=sizes)
    llc = last_level_cache_bytes() if device.type == "cpu" else 0
    if llc:
        # source and destination together fill half the cache
        ceilings.cache_bytes = llc
        ceilings.cache_copy_bytes_per_s = copy_bandwidth(device, llc // 4, min_time_s)
        details["cache_copy"] = (f"copy_ of {llc // 4 // 2**10} KiB float32 (last-level cache "
                                 f"{llc // 2**20} MiB), read + write bytes")
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
    return ceilings.best_of(Ceilings(flops, copy, cache, ceilings.cache_bytes))
