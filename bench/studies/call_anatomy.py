"""Where one estimator call's time goes: `glai-bench call-anatomy` (or `python -m
bench.studies.call_anatomy`).

The kernel suite times a call as its device sees it: on CUDA the median of CUDA-event-timed
calls, each after an L2 flush (bench/harness/timing.py, `time_cuda`). At the paper's batch a
call is a few short kernels, and that event time can be the host's: the stop-48 H200 lease
measured A1's forward at 47.6 µs on `cuda` against the 16-20 µs its kernels were predicted at
(docs/notes/cuda.md, "An H200 lease: issue 38's kernels measured, and the first GLAI training
on a GPU (stop 48)"). This study says which, per (head, pass, backend) at one batch:

- `event_us`: the suite's own timing of the call (on the CPU: its fastest call);
- `host_us`: the host's time to issue one call, the median of blocks of calls issued back to
  back without a synchronisation between them (on the CPU the call itself, so its median call
  against `event_us`'s fastest: the CPU form is the study's dry run, not a measurement);
- `kernels_us`: the device time of the kernels one call launches, from torch.profiler (the
  sum of its CUDA kernels' durations over the calls profiled, divided by the calls), with
  `kernels` the kernel launches per call and `top` the three longest by total time; none on
  the CPU, where there are no device kernels;
- `bound`: "host" when the host's issue time exceeds the kernels' (the event time is then the
  host's), "kernels" otherwise, "-" on the CPU.

    glai-bench call-anatomy --device cuda --heads A1 A2 B1 --batch 16 \\
        --passes forward both --backends cuda torch --out /tmp/anatomy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

from bench.cli_types import output_file, positive_int
from bench.harness.passes import PASSES, make_call
from bench.harness.runner import make_sets
from bench.harness.timing import best_call, sync, time_cuda, warm
from glai_kernels import registry
from glai_kernels.paper_heads import PAPER_HEADS

PROFILED_CALLS = 50  # calls under the profiler (a call's kernels are microseconds each)
HOST_CALLS = 50  # calls issued back to back for the host's time (well inside CUDA's queue)


@dataclass(frozen=True)
class Anatomy:
    """One (head, batch, pass, backend)'s times, in microseconds per call."""

    head: str
    batch: int
    pass_: str
    backend: str
    event_us: float
    host_us: float
    kernels_us: float | None
    kernels: float | None
    top: str

    @property
    def bound(self) -> str:
        if self.kernels_us is None:
            return "-"
        return "host" if self.host_us > self.kernels_us else "kernels"


def kernel_totals(events: Iterable, calls: int) -> tuple[float, float, str]:
    """(µs of device kernels per call, kernel launches per call, the three longest kernels) from
    torch.profiler's `key_averages()` entries: those whose `device_type` is CUDA, by their
    `self_device_time_total` (µs over all calls) and `count`."""
    cuda = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in cuda)
    launches = sum(e.count for e in cuda)
    longest = sorted(cuda, key=lambda e: e.self_device_time_total, reverse=True)[:3]
    top = "; ".join(f"{e.key[:40]} {e.self_device_time_total / calls:.1f}" for e in longest)
    return total / calls, launches / calls, top


def profile_kernels(fn: Callable[[], object], device: torch.device
                    ) -> tuple[float | None, float | None, str]:
    """`kernel_totals` of PROFILED_CALLS calls of fn on a CUDA device; (None, None, "") on the
    CPU."""
    if device.type != "cuda":
        return None, None, ""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILED_CALLS):
            fn()
        sync(device)
    return kernel_totals(prof.key_averages(), PROFILED_CALLS)


def host_time(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Seconds per call to issue fn, HOST_CALLS calls back to back with no synchronisation
    between them (the device drains its queue before each block): the median of `repeats`
    blocks."""
    blocks = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        blocks.append((time.perf_counter() - start) / HOST_CALLS)
    sync(device)
    return statistics.median(blocks)


def anatomy(head: str, batch: int, pass_: str, backend: str, device: torch.device,
            min_time_s: float = 0.2) -> Anatomy:
    """The three times of `pass_` of `head`'s shape at `batch` on `backend` (float32)."""
    shape = PAPER_HEADS[head].shape(batch)
    call = make_call(backend, PASSES[pass_], make_sets(shape, torch.float32, device, seed=0))
    fn = call.timed
    _, per_call = warm(fn, device)
    if device.type == "cuda":
        event = time_cuda(fn, device, min_time_s, per_call).median_s
    else:
        event = best_call(fn, min_time_s)
    kernels_us, launches, top = profile_kernels(fn, device)
    return Anatomy(head, batch, pass_, backend, event * 1e6, host_time(fn, device) * 1e6,
                   kernels_us, launches, top)


HEADER = ("| head | B | pass | backend | event µs | host µs | kernels µs | kernels/call | bound "
          "| longest kernels (µs a call) |\n|---|---|---|---|---|---|---|---|---|---|")


def table_row(r: Anatomy) -> str:
    """One row of the markdown table under HEADER."""
    kernels = "-" if r.kernels_us is None else f"{r.kernels_us:.1f}"
    launches = "-" if r.kernels is None else f"{r.kernels:.1f}"
    return (f"| {r.head} | {r.batch} | {r.pass_} | {r.backend} | {r.event_us:.1f} | "
            f"{r.host_us:.1f} | {kernels} | {launches} | {r.bound} | {r.top or '-'} |")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glai-bench call-anatomy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda"
                   if torch.cuda.is_available() else "cpu")
    p.add_argument("--heads", nargs="+", choices=sorted(PAPER_HEADS), default=["A1", "B1"])
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--passes", nargs="+", choices=sorted(PASSES), default=["forward", "both"])
    p.add_argument("--backends", nargs="+", default=None,
                   help="dense backends (default: every one available on the device)")
    p.add_argument("--out", type=output_file, default=None,
                   help="also write the rows as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("glai-bench call-anatomy: --device cuda, but torch sees no CUDA device",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    names = args.backends or [n for n in registry.names()
                              if registry.ESTIMATOR.availability(n, device.type) is None]
    for name in names:
        reason = (registry.ESTIMATOR.availability(name, device.type)
                  if name in registry.names() else f"not a backend ({registry.names()})")
        if reason is not None:
            print(f"glai-bench call-anatomy: --backends {name}: {reason}", file=sys.stderr)
            return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"call anatomy on {device} ({where}), float32, B = {args.batch}, µs per call")
    print(HEADER, flush=True)
    rows = []
    for head in args.heads:  # each row printed as it is measured: a cut-off run keeps them
        for pass_ in args.passes:
            for name in names:
                rows.append(anatomy(head, args.batch, pass_, name, device))
                print(table_row(rows[-1]), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([{**asdict(r), "bound": r.bound} for r in rows],
                                       indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
