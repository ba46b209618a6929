"""Memory: will a case fit (estimates, before running it), and how much did it take (measured).

Estimates count the elements a pass keeps alive at its peak: its inputs, dy, its results,
and the backend's own intermediates, which its registration estimates (`Backend.workspace`:
einsum materialises [B, I, P], torch keeps Z [O, B, P], and so on); a backend that gives no
estimate is fused (no intermediate larger than its results).

Measured peaks: on CUDA the caching allocator's peak above the memory allocated before the
call (`torch.cuda.max_memory_allocated`). On the CPU, torch's profiler with
`profile_memory=True` records every allocation and free of the c10 CPU allocator; the peak
of their running sum is the call's allocation peak. It counts tensors, not memory a library
allocates behind torch's back (oneDNN/MKL scratch buffers), and not the inputs that already
existed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable

import torch

from bench.harness.passes import PassSpec
from glai_kernels import registry
from glai_kernels.contract import Shape


def workspace_elements(backend: str, shape: Shape, spec: PassSpec) -> int:
    """The registered backend's intermediates at the peak of one call of `spec`: its
    forward's, its backward's, or the larger of the two for a pass that runs both."""
    impl = registry.get(backend)
    forward = impl.workspace_elements(shape, True, spec.grads) if (
        spec.contract_pass != "backward") else 0
    backward = impl.workspace_elements(shape, False, spec.grads) if spec.grads else 0
    return max(forward, backward)


def estimate_bytes(backend: str, shape: Shape, spec: PassSpec, itemsize: int) -> int:
    """Bytes one call of `spec` on `backend` keeps alive at its peak (inputs included)."""
    b, i, p, o = shape.batch, shape.inputs, shape.paths, shape.outputs
    data = b * i + b * p + o * i * p + b * o  # x, act, weight, dy
    data += (b * o if spec.contract_pass != "backward" else 0) + sum(
        {"x": b * i, "act": b * p, "weight": o * i * p}[g] for g in spec.grads)
    return (data + workspace_elements(backend, shape, spec)) * itemsize


def oracle_bytes(shape: Shape, chunk_bytes: int) -> int:
    """Bytes the float64 oracle needs: float64 copies of the inputs, its values and scales
    (two of each of y, dx, dact, dweight), and one chunk of intermediates (two while the
    abs-sum runs beside the value)."""
    b, i, p, o = shape.batch, shape.inputs, shape.paths, shape.outputs
    copies = b * i + b * p + o * i * p + b * o
    results = 2 * (b * o + b * i + b * p + o * i * p)
    # per chunk, the einsums cast weight (or |weight|) again
    return 8 * (copies + results + 2 * o * i * p) + 2 * chunk_bytes


def available_bytes(device: torch.device) -> int:
    """Memory free for new allocations on the device now (MemAvailable on the CPU)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


MEMORY_METHOD = {
    "cuda": "torch.cuda.max_memory_allocated above the allocation before the call",
    "cpu": "torch.profiler(profile_memory=True): peak of the c10 CPU allocator's running sum",
}


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: the profiler's C++ side logs each start and stop there."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak(fn: Callable[[], object]) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                  profile_memory=True) as prof:
        out = fn()
    del out
    sizes = []

    def walk(nodes) -> None:
        for node in nodes:
            fields = node.extra_fields
            if type(fields).__name__ == "_ExtraFields_Allocation":
                sizes.append((node.start_time_ns, fields.alloc_size))
            walk(node.children)

    # a private API: on a torch that lacks it, say so rather than guess
    try:
        walk(prof.profiler.kineto_results.experimental_event_tree())
    except AttributeError:
        return None
    sizes.sort()
    return max(itertools.accumulate((s for _, s in sizes), initial=0))


def _cuda_peak(fn: Callable[[], object], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return int(peak)


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Bytes allocated at the peak of one call of fn beyond what existed before it
    (None where it cannot be measured)."""
    if device.type == "cuda":
        return _cuda_peak(fn, device)
    return _cpu_peak(fn)
